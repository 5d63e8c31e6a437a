"""What participants are told about their outcome is the study's setting (nothing by default, the
outcome in words, or the score), never a score that checked nothing; a P4G donation stated in the
chat gets the persuader's closing reply before the chat ends, and the debrief confirms it."""

import pytest
from channels.db import database_sync_to_async
from django.urls import reverse

from studies.lib import domain_bridge
from studies.models import Message, Participant, Study
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.setup.scenario_pools import import_pool
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import GOOD_ANSWERS, make_study, prolific, talk


def finished(study, pid, scenario_key=None):
    """A participant through the chat (no message) and the questionnaire of `study`."""
    if scenario_key:
        study.scenarios.exclude(key=scenario_key).update(active=False)
    participant, _ = arrive(study, prolific(pid=pid, session_id=f"s-{pid}"))
    participant = give_consent(participant, True)
    participant = end_chat(participant, "participant_test")
    assert submit_questionnaire(participant, GOOD_ANSWERS) == {}
    return Participant.objects.get(pk=participant.pk)


def debrief(client, participant) -> str:
    return client.get(reverse("studies:participant", args=[participant.token])).content.decode()


def vacuous_retail_key(study) -> str:
    """A bundled retail task an empty chat scores 1 on (its gold actions change nothing)."""
    domain = domain_bridge.shared_domain("retail")
    for scenario in domain.scenarios():
        outcome = domain.score([], domain.new_state(scenario), None)
        if outcome.success:
            return f"retail-{scenario.id}"
    pytest.skip("no bundled retail task that an empty chat passes")


@pytest.mark.django_db
def test_default_tells_nothing_and_an_empty_tau2_chat_is_never_called_completed(client):
    study = make_study(slug="shop", domain="retail", min_exchanges=0)
    import_pool(study, "retail")
    key = vacuous_retail_key(study)
    participant = finished(study, "p1", key)
    assert participant.outcome["reward"] == 1.0  # the stored score is kept as it is
    assert participant.outcome["details"]["checked"] is False
    for setting in Study.Feedback.values:
        Study.objects.filter(pk=study.pk).update(outcome_feedback=setting)
        page = debrief(client, participant)
        assert "completed" not in page.lower() and "Score" not in page, setting
        assert "How the task went" not in page


@pytest.mark.django_db
def test_words_and_score_when_the_study_says_so(client):
    study = make_study(slug="shop", domain="retail", min_exchanges=0)
    import_pool(study, "retail")
    domain = domain_bridge.shared_domain("retail")
    checked = next(
        f"retail-{s.id}"
        for s in domain.scenarios()
        if not domain.score([], domain.new_state(s), None).success
    )
    participant = finished(study, "p1", checked)
    assert participant.study.outcome_feedback == Study.Feedback.NOTHING  # the default
    assert "How the task went" not in debrief(client, participant)
    Study.objects.filter(pk=study.pk).update(outcome_feedback=Study.Feedback.WORDS)
    page = debrief(client, participant)
    assert "The task was not completed." in page and "Score" not in page
    Study.objects.filter(pk=study.pk).update(outcome_feedback=Study.Feedback.SCORE)
    page = debrief(client, participant)
    assert "The task was not completed." in page and "Score: 0.00 (from 0 to 1)" in page


@pytest.mark.django_db
def test_open_chat_has_no_outcome_to_tell(client):
    study = make_study(outcome_feedback=Study.Feedback.SCORE)
    participant = finished(study, "p1")
    assert "How the task went" not in debrief(client, participant)


@database_sync_to_async
def p4g_participant(engine_url):
    study = make_study(slug="give", domain="p4g", engine=engine_url)
    import_pool(study, "p4g", count=2)
    participant, _ = arrive(study, prolific(pid="giver"))
    return give_consent(participant, True)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_stated_donation_gets_the_closing_reply_then_the_chat_ends():
    closing = "Thank you so much, the children will be grateful!"
    with ScriptedServer([{"content": closing}]) as server:
        participant = await p4g_participant(server.url)
        _, events = await talk(participant, "OK, I'll donate $1.20 to Save the Children.", "d1")
    kinds = [e["type"] for e in events]
    assert kinds.index("reply") < kinds.index("ended") < kinds.index("redirect")
    assert events[kinds.index("reply")]["message"]["content"] == closing
    assert events[kinds.index("ended")]["reason"] == "donation"

    @database_sync_to_async
    def stored():
        p = Participant.objects.get(pk=participant.pk)
        roles = list(p.conversation.messages.order_by("seq").values_list("role", "content"))
        return p, roles

    after, roles = await stored()
    assert after.status == Participant.Status.QUESTIONNAIRE
    assert after.conversation.end_reason == "donation"
    assert roles[-1] == (Message.Role.ASSISTANT, closing)
    assert after.outcome["components"]["donation"] == pytest.approx(1.2)


@pytest.mark.django_db
def test_the_debrief_confirms_the_donation_stated_in_the_chat(client):
    study = make_study(slug="give", domain="p4g")
    import_pool(study, "p4g", count=2)
    study.questionnaire.items.filter(key="donation").delete()  # no intended-donation item here
    participant, _ = arrive(study, prolific(pid="giver"))
    participant = give_consent(participant, True)
    store_user_message(participant, "g1", "I will give $0.80 to the charity.")
    participant = end_chat(Participant.objects.get(pk=participant.pk), "donation")
    answers = {k: v for k, v in GOOD_ANSWERS.items() if k != "donation"}
    assert submit_questionnaire(participant, answers) == {}
    page = debrief(client, Participant.objects.get(pk=participant.pk))
    assert "You chose to donate $0.80" in page and "Score" not in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setting", "shown", "hidden"),
    [
        ("nothing", [], ["completed", "Score"]),
        ("words", ["The task was completed."], ["Score"]),
        ("score", ["The task was completed.", "Score: 1.00 (from 0 to 1)"], []),
    ],
)
def test_a_checked_success_is_told_as_the_setting_says(client, setting, shown, hidden):
    study = make_study(slug="shop", domain="retail", min_exchanges=0, outcome_feedback=setting)
    import_pool(study, "retail", count=2)
    participant = finished(study, "p1")
    checked = {"reward": 1.0, "success": True, "components": {}, "details": {"checked": True}}
    Participant.objects.filter(pk=participant.pk).update(outcome=checked)
    page = debrief(client, participant)
    assert all(text in page for text in shown) and not any(text in page for text in hidden)
