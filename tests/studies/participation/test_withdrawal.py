"""Participants' data rights (issue 39): the consent each one agreed to is versioned, and a
participant can stop taking part from inside the study, from every page, and say whether the
data gathered so far may be kept."""

import csv
import hashlib
import io

import pytest
from django.urls import reverse

from studies.analysis.annotation import included
from studies.annotation import analysis as annotation_analysis
from studies.models import (
    AnnotationSetup,
    ConsentVersion,
    Conversation,
    Participant,
    RatedConversation,
    Response,
    StudyError,
    Withdrawal,
)
from studies.participation import withdraw
from studies.participation.arrive import arrive
from studies.participation.chat_turn import ChatOver, end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.research import analysis_runs, monitor, preregistration
from studies.research.exports import response_rows
from tests.support.studies import GOOD_ANSWERS, finish, make_study, prolific


@pytest.fixture(autouse=True)
def data_dir(tmp_path, settings):
    """An erasure rewrites the data folder's logs: these tests' erasures keep to their own."""
    settings.DATA_DIR = tmp_path
    return tmp_path


pytestmark = pytest.mark.django_db


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def arrived(study, pid):
    participant, _ = arrive(study, prolific(pid=pid, session_id=f"sess-{pid}"))
    return participant


# --- versioned consent ----------------------------------------------------------------------


def test_each_participant_names_the_consent_text_they_agreed_to(study):
    study.consent_text = "First text: we keep your answers."
    study.save()
    before = arrived(study, "early")
    give_consent(before, True)
    # Edited before anyone agreed: the same version, its text and hash follow the edit.
    assert ConsentVersion.objects.filter(study=study).count() == 1

    study.consent_text = "Second text: we keep your answers for ten years."
    study.save()
    later = arrived(study, "late")
    give_consent(later, True)

    before.refresh_from_db()
    later.refresh_from_db()
    first, second = before.consent_version, later.consent_version
    assert (first.version, first.text, first.sha256) == (
        1,
        "First text: we keep your answers.",
        sha("First text: we keep your answers."),
    )
    assert (second.version, second.sha256) == (2, sha(study.consent_text))
    assert later.consented_at is not None


def test_a_version_nobody_agreed_to_is_edited_in_place(study):
    for text in ("Draft one.", "Draft two.", "Draft three."):
        study.consent_text = text
        study.save()
    versions = list(ConsentVersion.objects.filter(study=study))
    assert [(v.version, v.text, v.sha256) for v in versions] == [
        (1, "Draft three.", sha("Draft three."))
    ]
    # Saving an unchanged text makes nothing new once someone agreed either.
    give_consent(arrived(study, "p"), True)
    study.title = "Renamed"
    study.save()
    assert ConsentVersion.objects.filter(study=study).count() == 1


def test_agreeing_to_a_text_that_changed_meanwhile_shows_the_new_one(client, study):
    client.get(f"/s/{study.slug}/", prolific(pid="reader"))
    participant = Participant.objects.get(prolific_pid="reader")
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    shown = ConsentVersion.objects.get(study=study)
    assert f'value="{shown.pk}"' in page
    # Someone else agrees to that text, then the researcher edits it: a new version.
    give_consent(arrived(study, "other"), True)
    study.consent_text = "We now also record your typing speed."
    study.save()
    response = client.post(
        reverse("studies:consent", args=[participant.token]),
        {"decision": "accept", "consent_version": shown.pk},
    )
    assert response.status_code == 409
    assert "typing speed" in response.content.decode()
    participant.refresh_from_db()
    assert participant.status == Participant.Status.CONSENT  # still theirs to decide
    assert participant.consent_version is None
    newer = ConsentVersion.objects.get(study=study, version=2)
    client.post(
        reverse("studies:consent", args=[participant.token]),
        {"decision": "accept", "consent_version": newer.pk},
    )
    participant.refresh_from_db()
    assert participant.status == Participant.Status.CHAT
    assert participant.consent_version == newer


def test_exports_and_the_frozen_plan_name_the_versions(study):
    plan = preregistration.freeze(study)
    version = ConsentVersion.objects.get(study=study)
    assert plan.plan["consent"] == {"version": 1, "sha256": version.sha256}
    finish(study, "one")
    study.consent_text = "A changed text."
    study.save()
    finish(study, "two")
    rows = list(response_rows(study.participants.all()))
    header = rows[0]
    by_pid = {row[header.index("prolific_pid")]: row for row in rows[1:]}
    column = header.index("consent_version")
    assert by_pid["one"][column] == 1 and by_pid["two"][column] == 2
    assert by_pid["two"][header.index("consent_sha256")] == sha("A changed text.")
    listed = analysis_runs.plan_document(study.preregistered())["consent_versions"]
    assert [(v["version"], v["participants"]) for v in listed] == [(1, 1), (2, 1)]


def test_the_migration_points_earlier_participants_at_a_reconstructed_version(
    study, django_db_blocker
):
    from importlib import import_module

    from django.apps import apps

    participant = finish(study, "before")
    # As before the migration: no versions, nobody pointing at one.
    Participant.objects.update(consent_version=None)
    ConsentVersion.objects.all().delete()
    migration = import_module("studies.migrations.0023_data_rights_consent")
    migration.version_existing_consent(apps, None)
    version = ConsentVersion.objects.get(study=study)
    assert version.reconstructed and version.sha256 == sha(study.consent_text)
    participant.refresh_from_db()
    assert participant.consent_version == version


# --- withdrawal -------------------------------------------------------------------------------


def stop_url(p):
    return reverse("studies:stop", args=[p.token])


@pytest.mark.parametrize("stage", ["chat", "questionnaire"])
def test_every_participant_page_offers_to_stop(client, study, stage):
    participant = arrived(study, "p")
    give_consent(participant, True)
    if stage == "questionnaire":
        store_user_message(participant, "m1", "hello")
        end_chat(participant)
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert stop_url(participant) in page and "Stop taking part" in page


def test_stopping_ends_the_chat_asks_about_the_data_and_keeps_it_when_allowed(client, study):
    participant = arrived(study, "p")
    give_consent(participant, True)
    store_user_message(participant, "m1", "my first words")
    confirm = client.get(stop_url(participant)).content.decode()
    assert "conversation ends now" in confirm and "return your submission" in confirm

    assert client.post(stop_url(participant)).status_code == 302
    participant.refresh_from_db()
    assert participant.status == Participant.Status.WITHDRAWN
    conversation = Conversation.objects.get(participant=participant)
    assert conversation.ended_at and conversation.end_reason == withdraw.WITHDRAWN
    with pytest.raises(ChatOver):  # the chat takes nothing more
        store_user_message(participant, "m2", "more")
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert 'id="withdrawn-ask"' in page and 'id="withdrawn-return"' in page

    data_url = reverse("studies:withdrawn-data", args=[participant.token])
    assert client.post(data_url, {"data": "maybe"}).status_code == 400  # never guessed
    client.post(data_url, {"data": "keep"})
    withdrawal = Withdrawal.objects.get(participant=participant)
    assert (withdrawal.stage, withdrawal.data_kept, withdrawal.paid) == ("chat", True, False)
    assert conversation.messages.filter(content="my first words").exists()
    # A second answer does not undo the first.
    client.post(data_url, {"data": "erase"})
    withdrawal.refresh_from_db()
    assert withdrawal.data_kept is True
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert 'id="withdrawn-kept"' in page and 'id="withdrawn-ask"' not in page


def test_a_study_that_pays_partial_participation_gives_its_completion_code(client, study):
    study.pays_partial = True
    study.save()
    participant = arrived(study, "p")
    give_consent(participant, True)
    store_user_message(participant, "m1", "hello")
    end_chat(participant)
    client.post(stop_url(participant))  # from the questionnaire
    client.post(reverse("studies:withdrawn-data", args=[participant.token]), {"data": "keep"})
    page = client.get(reverse("studies:participant", args=[participant.token])).content.decode()
    assert "DONE123" in page and "submissions/complete?cc=DONE123" in page
    assert Withdrawal.objects.get().paid and Withdrawal.objects.get().stage == "questionnaire"
    # What they answered before stopping is not taken as answered: nothing was submitted.
    assert not Response.objects.filter(participant=participant).exists()


def test_stopping_is_refused_where_there_is_nothing_to_stop(client, study):
    done = finish(study, "done")
    response = client.post(stop_url(done))
    assert response.status_code == 400 and "nothing to stop" in response.content.decode()
    reading = arrived(study, "reading")  # at consent: "I do not agree" is their way out
    assert client.post(stop_url(reading)).status_code == 400
    assert not Withdrawal.objects.exists()


def test_withdrawals_are_counted_on_the_monitor_and_in_the_analysis(study):
    for pid in ("a1", "a2", "a3"):
        finish(study, pid, arm="a")
    for pid in ("b1", "b2", "b3"):
        finish(study, pid, answers={**GOOD_ANSWERS, "helpful": "2"}, arm="b")
    kept = arrived(study, "kept")
    give_consent(kept, True)
    withdraw.withdraw(kept)
    withdraw.decide(kept, keep=True)
    unanswered = arrived(study, "silent")
    give_consent(unanswered, True)
    withdraw.withdraw(unanswered)

    counts = monitor.snapshot(study)["withdrawals"]
    assert (counts["total"], counts["kept"], counts["unanswered"]) == (2, 1, 1)
    table = analysis_runs.participant_table(study)
    assert sorted(table.loc[table["withdrawn"], "participant"]) == ["kept", "silent"]
    run = study.analysis_runs.create()
    analysis_runs.compute(run)
    run.refresh_from_db()
    excluded = run.results["participants"]["excluded"]["by_reason"]
    assert excluded["withdrew"] == 2, run.results["participants"]
    assert run.results["participants"]["included"] == 6


def test_an_erasure_that_fails_is_never_dropped_quietly(study, monkeypatch):
    participant = arrived(study, "p")
    give_consent(participant, True)
    withdraw.withdraw(participant)

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    from studies.privacy import erasure

    monkeypatch.setattr(erasure, "erase_participant", broken)
    step = withdraw.decide(participant, keep=False)
    assert not step.erased
    withdrawal = Withdrawal.objects.get()
    assert withdrawal.data_kept is False and withdrawal.erased_at is None
    problem = StudyError.objects.get(study=study)
    assert "Erasure after a withdrawal not done" in problem.title
    assert problem.participant is None  # no row of the problem points back at the person
    assert monitor.snapshot(study)["withdrawals"]["erasure_pending"] == 1


def test_asking_not_to_keep_the_data_erases_it(client, study):
    """Needs studies/privacy/erasure.py (issue 39 point 3, merged from the erasure branch):
    on a branch without it this fails (the recorded problem names the ImportError)."""
    participant = arrived(study, "5f0c0ffee0ddba11c0ffe999")
    give_consent(participant, True)
    store_user_message(participant, "m1", "a sentence only this person wrote")
    client.post(stop_url(participant))
    response = client.post(
        reverse("studies:withdrawn-data", args=[participant.token]), {"data": "erase"}
    )
    problems = list(StudyError.objects.values_list("detail", flat=True))
    assert not problems, problems
    page = response.content.decode()
    assert response.status_code == 200 and 'id="withdrawn-erased"' in page
    assert "5f0c0ffee0ddba11c0ffe999" not in page and str(participant.token) not in page
    withdrawal = Withdrawal.objects.get(study=study)
    assert withdrawal.data_kept is False and withdrawal.erased_at is not None
    assert not Participant.objects.filter(prolific_pid="5f0c0ffee0ddba11c0ffe999").exists()
    from studies.models import Message

    assert not Message.objects.filter(content__contains="only this person wrote").exists()
    # Still counted, without the person.
    assert monitor.snapshot(study)["withdrawals"]["erased"] == 1


def test_responses_csv_reads_back(study):
    finish(study, "one")
    text = "\n".join(",".join(map(str, row)) for row in response_rows(study.participants.all()))
    assert list(csv.DictReader(io.StringIO(text)))[0]["consent_version"] == "1"


def test_a_rater_stops_and_their_unrated_conversations_go_back_to_the_pool(client):
    study = annotation_study()
    rater, page = rater_arrives(client, study, "rater1")
    html = client.get(page).content.decode()
    assert stop_url(rater) in html
    first = rater.rating_assignments.get(position=1)
    client.post(
        reverse("studies:rate", args=[rater.token]),
        {
            "position": first.position,
            **GOOD_ANSWERS,
            "real_person": "real",
            "realism_confidence": "4",
        },
    )
    client.post(stop_url(rater))
    rater.refresh_from_db()
    assert rater.status == Participant.Status.WITHDRAWN
    statuses = dict(rater.rating_assignments.values_list("position", "status"))
    assert statuses == {1: "rated", 2: "released"}
    assert Withdrawal.objects.get(participant=rater).stage == "rating"
    # The rating they made is kept (not yet asked otherwise) but never analysed.
    ratings = annotation_analysis.ratings_of(study)
    assert [r["withdrawn"] for r in ratings] == [True]
    assert included(ratings, exclude_failed_attention=True) == []
    # The released conversation is another rater's to rate.
    released = rater.rating_assignments.get(position=2).conversation_id
    other, _ = rater_arrives(client, study, "rater2")
    other.refresh_from_db()
    assert other.status == Participant.Status.RATING
    assert released in set(other.rating_assignments.values_list("conversation_id", flat=True))


def annotation_study():
    """Three conversations, each for one rater, two per rater."""
    study = make_study(slug="rate", arms=("raters",))
    AnnotationSetup.objects.create(
        study=study, raters_per_conversation=1, conversations_per_rater=2, gold_per_rater=0
    )
    origin = make_study(slug="origin", arms=("agent",))
    for source in ("person", "simulator", "simulator"):
        RatedConversation.objects.create(
            study=study,
            source=source,
            arm="agent",
            origin_study=origin,
            transcript=[
                {"speaker": "agent", "text": "Hello"},
                {"speaker": "user", "text": "I would like a refund"},
            ],
        )
    return study


def rater_arrives(client, study, pid):
    client.get(reverse("studies:arrive", args=[study.slug]), prolific(pid=pid))
    participant = Participant.objects.get(study=study, prolific_pid=pid)
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    return participant, reverse("studies:participant", args=[participant.token])
