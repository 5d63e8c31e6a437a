"""A returning PROLIFIC_PID resumes only with its SESSION_ID or in the browser that started it."""

import threading

import pytest
from django.db import IntegrityError, connection
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from studies.lib.flow_errors import FlowError
from studies.models import Message, Participant
from studies.participation import arrive as arrival
from studies.participation import views
from studies.participation.chat_turn import store_user_message
from studies.participation.consent import give_consent
from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.django_db

VICTIM = "5f0c0ffee0ddba11c0ffee01"


def arrive(client, slug="s1", **params):
    return client.get(f"/s/{slug}/", params)


def chatting_victim(study) -> Participant:
    """The victim arrived in their own browser, consented and wrote one message."""
    response = arrive(Client(), **prolific(pid=VICTIM, session_id="victim-session"))
    assert response.status_code == 302
    victim = Participant.objects.get(prolific_pid=VICTIM)
    give_consent(victim, True)
    store_user_message(victim, "m1", "my private words")
    return victim


def snapshot():
    return (
        list(Participant.objects.values_list("pk", "status", "prolific_session_id")),
        list(Message.objects.values_list("pk", "content")),
    )


def assert_refused(response):
    assert response.status_code == 403
    page = response.content.decode()
    # What happened, in the participant's terms, and what they can do about it.
    assert "already started with your Prolific ID" in page
    assert "returned the study on Prolific and then took it again" in page
    assert "open the study from Prolific on the same device and browser" in page
    assert "message the researcher through Prolific" in page
    assert "another session" not in page  # a word a participant cannot act on
    assert "Location" not in response  # no way on to the participant's pages
    assert str(Participant.objects.get(prolific_pid=VICTIM).token) not in page
    assert views.ARRIVAL_COOKIE not in response.cookies


def test_victims_pid_with_another_session_id_is_refused_and_changes_nothing(study):
    chatting_victim(study)
    before = snapshot()
    attacker = Client()
    assert_refused(arrive(attacker, **prolific(pid=VICTIM, session_id="attacker-session")))
    assert snapshot() == before


def test_same_session_id_resumes_in_any_browser(study):
    victim = chatting_victim(study)
    again = arrive(Client(), **prolific(pid=VICTIM, session_id="victim-session"))
    assert again.url == reverse("studies:participant", args=[victim.token])


def test_a_new_session_id_resumes_in_the_same_browser_and_is_recorded(client, study):
    first = arrive(client, **prolific(pid=VICTIM, session_id="first-submission"))
    again = arrive(client, **prolific(pid=VICTIM, session_id="second-submission"))
    assert again.url == first.url
    assert Participant.objects.get().prolific_session_id == "second-submission"


def test_the_cookie_is_signed_httponly_lax_and_scoped_to_the_study(client, study, settings):
    response = arrive(client, **prolific())
    cookie = response.cookies[views.ARRIVAL_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and cookie["secure"]
    assert cookie["path"] == "/s/s1/"
    assert str(Participant.objects.get().token) in cookie.value  # readable, but signed
    settings.DEBUG = True  # a laptop on plain http keeps the cookie too
    assert not arrive(Client(), **prolific(pid="other")).cookies[views.ARRIVAL_COOKIE]["secure"]


def test_another_participants_cookie_opens_nothing(study):
    chatting_victim(study)
    attacker = Client()
    assert arrive(attacker, **prolific(pid="attacker", session_id="a1")).status_code == 302
    before = snapshot()
    assert_refused(arrive(attacker, **prolific(pid=VICTIM, session_id="attacker-session")))
    assert snapshot() == before


def test_a_forged_cookie_or_one_from_another_study_opens_nothing(study):
    victim = chatting_victim(study)
    other = make_study(slug="s2")
    attacker = Client()
    attacker.cookies[views.ARRIVAL_COOKIE] = str(victim.token)  # unsigned
    assert_refused(arrive(attacker, **prolific(pid=VICTIM, session_id="attacker-session")))
    # Signed, but for study s2: the signature names the study, so it does not open s1.
    response = HttpResponse()
    response.set_signed_cookie(
        views.ARRIVAL_COOKIE, str(victim.token), salt=views.arrival_salt(other)
    )
    attacker.cookies[views.ARRIVAL_COOKIE] = response.cookies[views.ARRIVAL_COOKIE].value
    assert_refused(arrive(attacker, **prolific(pid=VICTIM, session_id="attacker-session")))


def test_the_same_rule_when_the_victim_wins_a_race(study, monkeypatch):
    """The victim's request creates the participant between the attacker's lookup and its
    assignment: the unique constraint stops the second insert, whether _assign runs or fails."""
    real_assign = arrival._assign

    def victim_first_then(attacker_assign):
        def assign(study, values):
            real_assign(study, {**values, "SESSION_ID": "victim-session"})
            return attacker_assign(study, values)

        return assign

    def integrity_error(study, values):
        raise IntegrityError("duplicate key value violates unique constraint")

    attacker = prolific(pid=VICTIM, session_id="attacker-session")
    for attacker_assign in (real_assign, integrity_error):
        Participant.objects.all().delete()
        monkeypatch.setattr(arrival, "_assign", victim_first_then(attacker_assign))
        with pytest.raises(FlowError) as refused:
            arrival.arrive(study, attacker)
        assert refused.value.status == 403 and "already started" in refused.value.title
        victim = Participant.objects.get()
        assert victim.prolific_session_id == "victim-session"
        # The victim's own second tab in that race is let in.
        monkeypatch.setattr(arrival, "_assign", victim_first_then(attacker_assign))
        Participant.objects.all().delete()
        mine, _ = arrival.arrive(study, prolific(pid=VICTIM, session_id="victim-session"))
        assert mine == Participant.objects.get()


@pytest.mark.django_db(transaction=True)
def test_racing_arrivals_with_one_pid(transactional_db):
    """Twelve requests for one PID at once, six SESSION_IDs: whichever creates the participant,
    only the requests carrying its stored SESSION_ID get in."""
    study = make_study()
    start = threading.Barrier(12)
    outcomes = []

    def arrive_as(session_id):
        try:
            start.wait()
            participant, _ = arrival.arrive(study, prolific(pid=VICTIM, session_id=session_id))
            outcomes.append((session_id, participant.pk))
        except FlowError as error:
            outcomes.append((session_id, error.status))
        finally:
            connection.close()

    threads = [threading.Thread(target=arrive_as, args=(f"s{i % 6}",)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    owner = Participant.objects.get()
    assert sorted(outcomes) == sorted(
        (s, owner.pk if s == owner.prolific_session_id else 403) for s, _ in outcomes
    )
    assert len(outcomes) == 12
