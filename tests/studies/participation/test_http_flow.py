"""The participant's pages over HTTP: arrival, consent, questionnaire, completion, resume."""

import pytest
from django.urls import reverse

from studies.lib.flow_errors import FlowError
from studies.models import Message, Participant, Response, Study
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

pytestmark = pytest.mark.django_db


def arrive(client, slug="s1", **params):
    return client.get(f"/s/{slug}/", params)


@pytest.mark.parametrize(
    "params, words",
    [
        ({}, "missing PROLIFIC_PID, STUDY_ID, SESSION_ID"),
        ({"PROLIFIC_PID": "abc", "STUDY_ID": "x"}, "missing SESSION_ID"),
        (
            {"PROLIFIC_PID": "a b<c>", "STUDY_ID": "x", "SESSION_ID": "y"},
            "not valid Prolific identifiers: PROLIFIC_PID",
        ),
        ({"PROLIFIC_PID": "a" * 65, "STUDY_ID": "x", "SESSION_ID": "y"}, "PROLIFIC_PID"),
    ],
)
def test_bad_links_get_a_clear_page_and_create_nothing(client, study, params, words):
    response = arrive(client, **params)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert Participant.objects.count() == 0


def test_unknown_study_and_closed_study(client, study):
    assert arrive(client, slug="nope", **prolific()).status_code == 404
    study.status = Study.Status.DRAFT
    study.save()
    response = arrive(client, **prolific())
    assert response.status_code == 403 and "not open" in response.content.decode()
    assert Participant.objects.count() == 0


def test_study_id_must_match_when_configured(client, study):
    study.prolific_study_id = "theone"
    study.save()
    assert arrive(client, **prolific(study_id="other")).status_code == 400
    assert arrive(client, **prolific(study_id="theone")).status_code == 302


def test_full_flow_to_prolific(client, study):
    response = arrive(client, **prolific())
    participant = Participant.objects.get()
    assert response.url == reverse("studies:participant", args=[participant.token])
    assert "I agree" in client.get(response.url).content.decode()

    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    participant.refresh_from_db()
    assert participant.status == "chat" and participant.consented_at
    page = client.get(response.url).content.decode()
    assert f"/ws/p/{participant.token}/" in page

    # A message, then end the chat (the consumer does this over the socket; the rules are in chat_turn).
    store_user_message(participant, "m1", "hello")
    end_chat(participant)
    participant.refresh_from_db()
    assert participant.status == "questionnaire"
    page = client.get(response.url).content.decode()
    assert 'name="helpful"' in page and 'type="number" step="any" name="donation"' in page

    done = client.post(reverse("studies:questionnaire", args=[participant.token]), GOOD_ANSWERS)
    assert done.status_code == 302
    participant.refresh_from_db()
    assert participant.status == "completed" and participant.attention_passed is True
    answers = {r.item.key: r.value for r in Response.objects.filter(participant=participant)}
    assert answers == {
        "helpful": 6.0,
        "frustration": 2.0,
        "attn": 2.0,
        "donation": 1.5,
        "comment": "fine",
    }
    debrief = client.get(response.url).content.decode()
    assert "Thank you" in debrief and "DONE123" in debrief
    back = client.get(reverse("studies:done", args=[participant.token]))
    assert back.status_code == 302
    assert back.url == "https://app.prolific.com/submissions/complete?cc=DONE123"


def test_decline_leads_to_no_consent_code(client, study):
    arrive(client, **prolific())
    participant = Participant.objects.get()
    # Only the two buttons decide; a stray value is refused and changes nothing.
    for stray in ({}, {"decision": ""}, {"decision": "maybe"}):
        response = client.post(reverse("studies:consent", args=[participant.token]), stray)
        assert response.status_code == 400 and "Please choose" in response.content.decode()
    participant.refresh_from_db()
    assert participant.status == "consent"
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "decline"})
    participant.refresh_from_db()
    assert participant.status == "no_consent"
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert "You chose not to take part" in page and "time limit" not in page
    back = client.get(reverse("studies:done", args=[participant.token]))
    assert back.url == "https://app.prolific.com/submissions/complete?cc=NOCONS"
    # Declining frees the place: the next arrival goes to the same arm.
    arrive(client, **prolific(pid="second"))
    assert Participant.objects.get(prolific_pid="second").arm == participant.arm


def test_reopening_the_link_resumes_the_same_participant(client, study):
    first = arrive(client, **prolific())
    participant = Participant.objects.get()
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    store_user_message(participant, "m1", "hello there")
    again = arrive(client, **prolific(session_id="another-session"))
    assert again.url == first.url
    assert Participant.objects.count() == 1
    assert "ws/p/" in client.get(again.url).content.decode()  # back at the chat step
    assert Message.objects.filter(conversation__participant=participant).count() == 1


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"helpful": ""}, "helpful", "Please answer"),
        ({"helpful": "8"}, "helpful", "points 1 to 7"),
        ({"helpful": "2.5"}, "helpful", "points 1 to 7"),
        ({"donation": "3"}, "donation", "at most 2"),
        ({"donation": "-1"}, "donation", "at least 0"),
        ({"donation": "lots"}, "donation", "enter a number"),
        ({"attn": ""}, "attn", "Please answer"),
    ],
)
def test_questionnaire_is_validated_on_the_server(client, study, change, key, message):
    participant = questionnaire_participant(client)
    response = client.post(
        reverse("studies:questionnaire", args=[participant.token]), {**GOOD_ANSWERS, **change}
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    participant.refresh_from_db()
    assert participant.status == "questionnaire"
    assert Response.objects.count() == 0  # nothing half-stored


def test_failed_attention_check_is_recorded(client, study):
    participant = questionnaire_participant(client)
    client.post(
        reverse("studies:questionnaire", args=[participant.token]), {**GOOD_ANSWERS, "attn": "5"}
    )
    participant.refresh_from_db()
    assert participant.status == "completed" and participant.attention_passed is False


def test_time_limit(client, study):
    arrive(client, **prolific())
    participant = Participant.objects.get()
    Participant.objects.filter(pk=participant.pk).update(
        created_at=participant.created_at
        - __import__("datetime").timedelta(minutes=study.time_limit_minutes + 1)
    )
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert "time limit" in page
    participant.refresh_from_db()
    assert participant.status == "timed_out"
    back = client.get(reverse("studies:done", args=[participant.token]))
    assert back.url.endswith("cc=LATE")


def test_end_chat_requires_min_exchanges(client, db):
    study = make_study(slug="s2", min_exchanges=2)
    arrive(client, slug="s2", **prolific())
    participant = Participant.objects.get(study=study)
    give_consent(participant, True)
    store_user_message(participant, "m1", "one")
    with pytest.raises(FlowError, match="at least 2"):
        end_chat(participant)


def test_an_over_long_message_is_refused_whole_saying_by_how_much(client, db):
    study = make_study(slug="s2", max_message_chars=2000)
    arrive(client, slug="s2", **prolific())
    participant = Participant.objects.get(study=study)
    give_consent(participant, True)
    with pytest.raises(FlowError) as refused:
        store_user_message(participant, "m1", "word " * 420)  # 2,100 characters
    assert refused.value.detail == (
        "This message was not sent: it is 2,100 characters long and the limit is 2,000. "
        "Please shorten it and send it again."
    )
    assert not Message.objects.filter(conversation__participant=participant).exists()
    store_user_message(participant, "m2", "x" * 2000)  # the limit itself is allowed


def questionnaire_participant(client):
    arrive(client, **prolific())
    participant = Participant.objects.get()
    give_consent(participant, True)
    store_user_message(participant, "m1", "hello")
    return end_chat(participant)
