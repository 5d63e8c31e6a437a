"""What a Domain reads from the questionnaire (P4G: the donation) is chosen in the admin, checked
at go-live, and never dropped: an answer the Domain needed and did not get is a problem the
researcher sees, never "You chose not to donate"."""

import pytest
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.urls import reverse

from studies.models import Item, Participant, Study, StudyError
from studies.participation.arrive import arrive
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.participation.questionnaire import submit_questionnaire
from studies.setup import go_live
from studies.setup.scenario_pools import import_pool
from tests.support.scripted_server import ScriptedServer
from tests.support.studies import change_form_data, make_study, prolific

pytestmark = pytest.mark.django_db

ANSWERS = {"helpful": "5", "frustration": "3", "attn": "2", "bonus_given": "1"}


@pytest.fixture(autouse=True)
def no_remembered_health():
    cache.clear()


@pytest.fixture
def engine():
    with ScriptedServer([], models=["served-model"]) as server:
        yield server


def p4g_study(engine_url="http://127.0.0.1:9/v1", **fields) -> Study:
    """A P4G study whose questionnaire asks the donation under a key of the researcher's own."""
    study = make_study(slug="give", domain="p4g", engine=engine_url, **fields)
    study.arms.update(model_name="served-model")
    import_pool(study, "p4g", count=2)
    study.questionnaire.items.filter(key="donation").update(key="bonus_given")
    return study


def chatted(study: Study, pid: str) -> Participant:
    participant, _ = arrive(study, prolific(pid=pid))
    participant = give_consent(participant, True)
    store_user_message(participant, "m1", "Tell me more about the charity.")  # no amount
    return end_chat(Participant.objects.get(pk=participant.pk), "participant")


def debrief(client, participant) -> str:
    url = reverse("studies:participant", args=[participant.token])
    return client.get(url).content.decode()


def test_a_donation_item_mapped_in_the_admin_is_the_outcome(admin_client, client, engine):
    study = p4g_study(engine.url, status=Study.Status.DRAFT)
    # unmapped: going live is refused, naming what the task needs
    with pytest.raises(go_live.NotReady) as refused:
        go_live.set_live(study)
    assert any("needs donation" in p and "answers the task's" in p for p in refused.value.problems)

    # the researcher maps the item in the questionnaire's admin page
    url = reverse("admin:studies_questionnaire_change", args=[study.questionnaire.pk])
    page = admin_client.get(url)
    item = study.questionnaire.items.get(key="bonus_given")
    [form] = [
        f
        for f in page.context["inline_admin_formsets"][0].formset.forms
        if f.instance.pk == item.pk
    ]
    offered = [value for value, _ in form.fields["domain_input"].choices]
    assert offered == ["", "donation"]  # only what this study's Domain reads
    data = change_form_data(admin_client, url)
    data[form.add_prefix("domain_input")] = "donation"
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context and response.context["errors"]
    assert Item.objects.get(pk=item.pk).domain_input == "donation"

    go_live.set_live(study)
    participant = chatted(study, "giver")
    assert submit_questionnaire(participant, ANSWERS) == {}
    participant.refresh_from_db()
    assert participant.outcome["components"]["donation"] == 1.0
    assert participant.outcome["reward"] == pytest.approx(0.5)
    page = debrief(client, participant)
    assert "You chose to donate $1.00" in page and "not to donate" not in page
    assert not StudyError.objects.exists()


def test_going_live_refuses_an_item_that_cannot_hold_the_donation(admin_client):
    study = p4g_study(status=Study.Status.DRAFT)
    item = study.questionnaire.items.get(key="bonus_given")
    item.domain_input = "donation"
    for change, words in [
        (dict(max_value=10), "must lie within 0 to 2"),
        (dict(min_value=None), "must lie within 0 to 2"),
        (dict(required=False), "must be required"),
        (dict(kind=Item.Kind.TEXT), "free text item cannot hold"),
    ]:
        bad = Item(**{**{f.attname: getattr(item, f.attname) for f in Item._meta.fields}})
        for name, value in change.items():
            setattr(bad, name, value)
        with pytest.raises(ValidationError, match=words):
            bad.full_clean()
        Item.objects.filter(pk=item.pk).update(domain_input="donation", **change)
        assert any(words in p for p in go_live.problems(study)), change
        Item.objects.filter(pk=item.pk).update(
            kind=Item.Kind.NUMBER, min_value=0, max_value=2, required=True
        )
    # an answer the Domain does not read, and the same answer from two items
    other = Item.objects.create(
        questionnaire=study.questionnaire,
        order=9,
        key="asked_again",
        prompt="How much, again?",
        kind=Item.Kind.NUMBER,
        min_value=0,
        max_value=2,
    )
    with pytest.raises(ValidationError, match="reads no such answer"):
        Item(questionnaire=study.questionnaire, key="x", prompt="?", domain_input="tip").clean()
    url = reverse("admin:studies_questionnaire_change", args=[study.questionnaire.pk])
    data = change_form_data(admin_client, url)
    forms = admin_client.get(url).context["inline_admin_formsets"][0].formset.forms
    [again] = [f for f in forms if f.instance.pk == other.pk]
    data[again.add_prefix("domain_input")] = "donation"
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "is given twice" in response.content.decode()
    assert Item.objects.get(pk=other.pk).domain_input == ""


def test_a_missing_mapping_is_a_problem_for_the_researcher_never_no_donation(client):
    study = p4g_study()  # live, as a study set live before the checks
    participant = chatted(study, "giver")
    assert submit_questionnaire(participant, ANSWERS) == {}
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED  # their answers are kept
    assert participant.responses.get(item__key="bonus_given").value == 1.0
    [problem] = StudyError.objects.filter(study=study, participant=participant)
    assert "no answer for donation" in problem.detail
    page = debrief(client, participant)
    assert "not to donate" not in page and "did not choose a donation" in page


def test_a_mapped_answer_outside_the_domain_bounds_is_asked_again():
    study = p4g_study()
    # mapped, then widened after going live: the participant is asked again, nothing is dropped
    study.questionnaire.items.filter(key="bonus_given").update(
        domain_input="donation", max_value=10, required=False
    )
    participant = chatted(study, "giver")
    errors = submit_questionnaire(participant, {**ANSWERS, "bonus_given": "5"})
    assert errors == {"bonus_given": "Please enter a number from 0 to 2."}
    errors = submit_questionnaire(participant, {**ANSWERS, "bonus_given": ""})
    assert errors == {"bonus_given": "Please answer this question."}
    assert Participant.objects.get(pk=participant.pk).status == Participant.Status.QUESTIONNAIRE


def test_the_migration_maps_the_seeded_intended_donation_item(transactional_db):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("studies", "0014_study_bot_key")], [("studies", "0015_item_domain_input")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    for slug, domain in (("p4g-old", "p4g"), ("chat-old", "chat")):
        study = old.get_model("studies", "Study").objects.create(
            slug=slug, title=slug, domain=domain
        )
        questionnaire = old.get_model("studies", "Questionnaire").objects.create(study=study)
        for key in ("intended_donation", "helpful"):
            old.get_model("studies", "Item").objects.create(
                questionnaire=questionnaire, key=key, prompt="?"
            )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    new = executor.loader.project_state(after).apps.get_model("studies", "Item")
    mapped = set(new.objects.exclude(domain_input="").values_list("questionnaire__study__slug"))
    assert mapped == {("p4g-old",)}
    assert new.objects.get(questionnaire__study__slug="p4g-old", domain_input="donation").key == (
        "intended_donation"
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
