"""Erasure on request and the per-person export (issue 39 points 3 and 4).

A person's Prolific id, their tokens and a sentence they wrote go through every flow parley has
(the chat, the questionnaire, rating in an annotation study, a bonus, a refused bonus line, a
problem, an analysis run of each study, a redacted copy of their conversation in a pool and
another rater's rating of it, a saved export and an old log in the data folder, a Prolific
webhook, an admin edit); after the erasure, every table of the database (read as raw rows, all
of them) and every file under the data folder hold none of them, while another person's data
and the payment record stay.
"""

import json
import time
from decimal import Decimal
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from studies.annotation.pool import add_people
from studies.lib.flow_errors import FlowError
from studies.models import (
    AnalysisRun,
    AnnotationSetup,
    Bonus,
    BonusPayment,
    Conversation,
    ErasureRecord,
    Participant,
    ProlificEvent,
    Review,
    Withdrawal,
)
from studies.participation import arrive as arrival
from studies.participation import problems
from studies.participation.chat_turn import end_chat, store_user_message
from studies.participation.consent import give_consent
from studies.privacy import places
from studies.privacy.erasure import ErasureRefused, erase_by_prolific_id, erase_participant
from studies.privacy.export import export_participant
from studies.prolific import api as prolific_api
from studies.prolific import sync as prolific_sync
from studies.prolific.sync import create_payment
from studies.research import exports
from studies.research.analysis_runs import compute
from tests.support.studies import GOOD_ANSWERS, SECRET, change_form_data, make_study, prolific

pytestmark = pytest.mark.django_db

PID = "erasemePID7Q2Zx9"  # not Prolific's 24 hex digits: no log mask may hide it by chance
SUBMISSION = "SUBMISSIONerase01"
SAID = "my parrot Quetzalcoatl-77 lives on Wrenfield Lane"
OTHER_PID = "keepmePID4K8Wy2"
OTHER_SAID = "another person's words, Lindqvist-55"
REASON = "Asked by e-mail on 6 December; identity checked against the Prolific message."


def arrive(client, study, pid, session):
    client.get(f"/s/{study.slug}/", prolific(pid=pid, study_id="STUDYP", session_id=session))
    participant = Participant.objects.get(study=study, prolific_pid=pid)
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    participant.refresh_from_db()
    return participant


def chat_and_answer(client, participant, said):
    store_user_message(participant, "m-1", said)
    end_chat(participant)
    answers = {**GOOD_ANSWERS, "comment": said}
    response = client.post(reverse("studies:questionnaire", args=[participant.token]), answers)
    assert response.status_code == 302, response.content.decode()[:500]
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED


def rate_all(client, rater, comment):
    while True:
        rater.refresh_from_db()
        assigned = rater.rating_assignments.filter(status="assigned").order_by("position").first()
        if assigned is None:
            return
        data = {
            "position": assigned.position,
            **GOOD_ANSWERS,
            "comment": comment,
            "real_person": "real",
            "realism_confidence": "4",
        }
        response = client.post(reverse("studies:rate", args=[rater.token]), data)
        assert response.status_code == 302, response.content.decode()[:500]


def webhook(client, body: dict):
    raw = json.dumps(body).encode()
    stamp = str(int(time.time()))
    with override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET):
        response = client.post(
            "/prolific/webhook/",
            raw,
            content_type="application/json",
            headers={
                "X-Prolific-Request-Timestamp": stamp,
                "X-Prolific-Request-Signature": prolific_api.signature(SECRET, stamp, raw),
                "X-Event-ID": f"evt-{body['resource_id']}",
            },
        )
    assert response.status_code == 200, response.content


@pytest.fixture
def data_dir(tmp_path):
    with override_settings(DATA_DIR=tmp_path):
        yield tmp_path


@pytest.fixture
def admin_client(db):
    user = User.objects.create_superuser("researcher", "r@example.org", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def planted(data_dir, admin_client):
    """The person through every flow; returns what names them (ids, tokens, words)."""
    client = Client()
    origin = make_study(slug="origin", arms=("a",), prolific_study_id="STUDYP")
    person = arrive(client, origin, PID, SUBMISSION)
    chat_and_answer(client, person, SAID)
    other = arrive(client, origin, OTHER_PID, "SUBMISSIONkeep01")
    chat_and_answer(client, other, OTHER_SAID)

    # A bonus, paid; a payment Prolific refused, whose lines name both.
    payment, _ = create_payment(origin, [(person, Decimal("1.50"))], "test bonus")
    BonusPayment.objects.filter(pk=payment.pk).update(
        state=BonusPayment.State.PAID, setup_id="SETUP1", paid_at=timezone.now()
    )
    BonusPayment.objects.create(
        study=origin,
        source="bonus.csv",
        state=BonusPayment.State.FAILED,
        refused_lines=[[PID, "0.50"], [OTHER_PID, "0.50"]],
    )

    # A problem (as recorded now: path masked) and an old one whose path still holds the token.
    problems.record(
        origin, person, f"/p/{person.token}/questionnaire/", FlowError("Trouble", f"for {PID}")
    )
    problems.record(origin, None, f"/p/{person.token}/", FlowError("Old", "before masking"))
    from studies.models import StudyError

    StudyError.objects.create(study=origin, path=f"/p/{person.token}/", title="unmasked")

    # A Prolific webhook about their submission.
    webhook(
        client,
        {
            "event_type": "submission.status.change",
            "resource_id": SUBMISSION,
            "status": "AWAITING REVIEW",
            "participant_id": PID,
        },
    )

    # The researcher's decision on their submission (the webhook said it awaits review).
    queued, skipped = prolific_sync.decide(
        Participant.objects.filter(pk=person.pk), Review.Action.APPROVE
    )
    assert queued and not skipped, skipped

    # Their conversation copied into an annotation pool with two others'; two raters rate it
    # (each gets 2 of the 3, the least-rated first, so every copy is rated).
    chat_and_answer(client, arrive(client, origin, "thirdPID", "SUBMISSIONkeep03"), "a third")
    pool = make_study(slug="pool", arms=("raters",), prolific_study_id="STUDYP")
    AnnotationSetup.objects.create(
        study=pool, raters_per_conversation=3, conversations_per_rater=2, gold_per_rater=0
    )
    assert add_people(pool, origin) == 3
    [copy] = [c for c in pool.rated_conversations.all() if SAID in json.dumps(c.transcript)]
    for number in (1, 2):
        rate_all(client, arrive(client, pool, f"raterKEEP{number}", f"SUBMISSIONr{number}"), "ok")
    assert copy.assignments.filter(status="rated").exists()
    # They also rate, in a pool of a study they were not in (their own are never given them).
    elsewhere = make_study(slug="elsewhere", arms=("a",), prolific_study_id="STUDYP")
    for name in ("e1", "e2"):
        chat_and_answer(client, arrive(client, elsewhere, name, f"SUB{name}"), f"words of {name}")
    rating_pool = make_study(slug="rating-pool", arms=("raters",), prolific_study_id="STUDYP")
    AnnotationSetup.objects.create(
        study=rating_pool, raters_per_conversation=1, conversations_per_rater=2, gold_per_rater=0
    )
    assert add_people(rating_pool, elsewhere) == 2
    as_rater = arrive(client, rating_pool, PID, "SUBMISSIONerase02")
    rate_all(client, as_rater, SAID)
    assert as_rater.rating_assignments.filter(status="rated").count() == 2

    # They stopped taking part in a third study from inside it, letting what was said be kept.
    left = make_study(slug="left", arms=("a",), prolific_study_id="STUDYP")
    stopped = arrive(client, left, PID, "SUBMISSIONerase03")
    store_user_message(stopped, "m-1", SAID)
    assert client.post(reverse("studies:stop", args=[stopped.token])).status_code == 302
    client.post(reverse("studies:withdrawn-data", args=[stopped.token]), {"data": "keep"})
    assert Withdrawal.objects.filter(participant=stopped, data_kept=True).exists()

    # An analysis run of each study, kept with its inputs.
    for study in (origin, pool, rating_pool):
        run = compute(AnalysisRun.objects.create(study=study))
        assert run.status == AnalysisRun.Status.DONE, run.error

    # An admin edit of their row (the admin log names it by its str: the Prolific id).
    url = reverse("admin:studies_participant_change", args=[person.pk])
    assert admin_client.post(url, change_form_data(admin_client, url)).status_code == 302

    # Files a researcher or an older version left in the data folder: a saved export, a log.
    saved = data_dir / "exports" / "origin-responses.csv"
    saved.parent.mkdir()
    saved.write_text(
        "\n".join(
            ",".join(map(str, row)) for row in exports.response_rows(origin.participants.all())
        )
        + "\n"
    )
    log = data_dir / "logs" / "web.log"
    log.parent.mkdir()
    log.write_text(f"GET /p/{person.token}/ 200\nnothing here\npid={PID}\n")
    (data_dir / "logs" / "other.log").write_text(f"pid={OTHER_PID}\n")

    return {
        "needles": [
            PID,
            SAID,
            str(person.token),
            person.token.hex,
            str(as_rater.token),
            as_rater.token.hex,
            str(stopped.token),
            stopped.token.hex,
        ],
        "person": person,
        "as_rater": as_rater,
        "stopped": stopped,
        "origin": origin,
        "pool": pool,
    }


def database_text() -> dict[str, str]:
    """Every table of the database, every row, as text: what a dump would show."""
    found = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            found[table] = "\n".join(
                " | ".join(
                    v.decode("utf-8", "replace")
                    if isinstance(v, bytes | memoryview) and not isinstance(v, memoryview)
                    else str(v)
                    for v in row
                )
                for row in cursor.fetchall()
            )
    return found


def files_text(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_bytes().decode("utf-8", "replace")
        for path in root.rglob("*")
        if path.is_file()
    }


def redis_text() -> str:
    """Every key of the site's Redis (when it has one) and every string value."""
    from django.conf import settings

    if not settings.REDIS_URL:
        return ""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    text = []
    for key in client.scan_iter():
        text.append(key.decode("utf-8", "replace"))
        if client.type(key) == b"string":
            text.append((client.get(key) or b"").decode("utf-8", "replace"))
    return "\n".join(text)


def where(needles, texts: dict[str, str]) -> list[tuple[str, str]]:
    return [(needle, name) for needle in needles for name, text in texts.items() if needle in text]


def test_planting_reaches_every_place(planted):
    """The fixture is only worth its search if the ids and words were everywhere first."""
    tables = database_text()
    for table in [
        "studies_participant",
        "studies_message",
        "studies_response",
        "studies_ratingassignment",
        "studies_ratedconversation",
        "studies_analysisrun",
        "studies_prolificevent",
        "studies_bonuspayment",
        "studies_studyerror",
        "django_admin_log",
    ]:
        assert any(n in tables[table] for n in planted["needles"]), table
    exports_ = [export_participant(planted[who]) for who in ("person", "as_rater", "stopped")]
    empty = [
        place.name
        for place in places.PLACES
        if not any(export["places"][place.name]["held"] for export in exports_)
    ]
    assert empty == []


def test_erasure_from_the_admin_leaves_nothing_behind(planted, admin_client, data_dir):
    page = reverse("admin:studies_erasurerecord_erase")
    records = admin_client.get(reverse("admin:studies_erasurerecord_changelist"))
    assert page in records.content.decode()  # the way to it
    assert "Prolific id" in admin_client.get(page).content.decode()
    # Without a reason nothing happens, and the page says what is missing.
    asked = admin_client.post(page, {"prolific_pid": PID, "reason": " ", "confirm": "on"})
    assert asked.status_code == 200 and "This field is required" in asked.content.decode()
    assert Participant.objects.filter(prolific_pid=PID).count() == 3
    response = admin_client.post(page, {"prolific_pid": PID, "reason": REASON, "confirm": "on"})
    assert response.status_code == 302, response.content.decode()[-2000:]

    needles = planted["needles"]
    assert where(needles, database_text()) == []
    assert where(needles, files_text(data_dir)) == []
    assert [n for n in needles if n in redis_text()] == []

    # Everyone else's data stays, and so does the payment record.
    tables = database_text()
    assert OTHER_PID in tables["studies_participant"] and OTHER_SAID in tables["studies_message"]
    assert "raterKEEP1" in tables["studies_participant"]
    assert OTHER_PID in json.dumps(list(BonusPayment.objects.values_list("refused_lines")))
    assert f"pid={OTHER_PID}" in (data_dir / "logs" / "other.log").read_text()
    [bonus] = Bonus.objects.all()
    assert bonus.participant is None and bonus.submission_id == SUBMISSION
    assert bonus.amount == Decimal("1.50") and bonus.payment.paid_at is not None
    # The webhook stays as a refusal of replays, empty of them.
    [event] = ProlificEvent.objects.all()
    assert event.payload == {} and event.digest

    records = list(ErasureRecord.objects.order_by("participant_number"))
    # their chat, their rating and the study they stopped: one record per participation
    assert len(records) == 3
    first = records[0]
    assert first.reason == REASON and first.erased_by == "researcher"
    assert first.counts["messages"] == 1 and first.counts["responses"] == 5
    assert first.counts["pool_copies"] >= 2  # the copy, and the ratings of it
    assert records[1].counts["ratings"] == 2
    # the withdrawal row stays, for the counts, linked to no one
    assert records[2].counts["withdrawal"] == 1 and records[2].counts["messages"] == 1
    assert Withdrawal.objects.filter(participant=None, data_kept=True).count() == 1
    # Both participations share the Prolific id: a run or file naming it is the first's to clean.
    total = {name: sum(r.counts[name] for r in records) for name in first.counts}
    # (the log's line with the first's token is the second's: 2 files, 3 redactions)
    assert total["analysis_runs"] == 3 and total["files"] == 3
    assert first.kept == [
        {"bonus": bonus.pk, "amount": "1.50", "paid_at": bonus.payment.paid_at.isoformat()}
    ]
    # Each run says that it was computed before the erasure.
    assert sorted(AnalysisRun.objects.values_list("erased_participants", flat=True)) == [1, 1, 1]
    run = AnalysisRun.objects.filter(study=planted["origin"]).get()
    shown = admin_client.get(reverse("admin:studies_analysisrun_change", args=[run.pk]))
    assert "Computed before the erasure of 1 participant(s)" in shown.content.decode()
    assert run.inputs["participants"] == 2  # of the 3 analysed


def test_export_and_erasure_cover_the_same_places(planted):
    """Every place the export lists is emptied by the erasure, and every place the erasure
    touches is in the export: for each of the person's participations (a chat, a rating, a
    study they stopped)."""
    person = planted["person"]
    first = json.dumps(export_participant(person)["places"])
    assert PID in first and SAID in first and str(person.token) not in first
    for who in ("person", "as_rater", "stopped"):
        exported = export_participant(planted[who])["places"]
        held = {name for name, place in exported.items() if place["held"]}
        record = erase_participant(planted[who], reason=REASON, by="test")
        touched = {name for name, count in record.counts.items() if count}
        assert set(record.counts) == set(exported)
        assert touched == held, (who, touched ^ held)
    assert "withdrawal" in touched  # the stopped study's row, unlinked
    # The pieces the exports showed are nowhere now.
    assert not Participant.objects.filter(prolific_pid=PID).exists()
    assert where([PID, SAID, str(person.token)], database_text()) == []


def test_every_model_about_a_person_has_a_place():
    """A new model pointing at a participant, a conversation or a pool copy must be in the
    registry (or the erasure would leave it behind)."""
    covered = {model for place in places.PLACES for model in place.covers}
    about_people = {Participant, Conversation}
    from studies.models import RatedConversation

    about_people.add(RatedConversation)
    missing = []
    for model in apps.get_models():
        for field in model._meta.get_fields():
            target = getattr(field, "related_model", None)
            if field.concrete and target in about_people and model not in covered:
                missing.append(f"{model._meta.label}.{field.name}")
    assert missing == []


def test_a_paid_bonus_is_no_obstacle_but_an_unpaid_one_is(data_dir):
    study = make_study(slug="pay", arms=("a",), prolific_study_id="STUDYP")
    person, _ = arrival.arrive(study, prolific(pid=PID, study_id="STUDYP", session_id=SUBMISSION))
    payment, _ = create_payment(study, [(person, Decimal("2.00"))], "rule")
    with pytest.raises(ErasureRefused, match="still being set up or sent"):
        erase_participant(person, reason=REASON)
    assert Participant.objects.filter(pk=person.pk).exists()
    assert ErasureRecord.objects.count() == 0
    with pytest.raises(ErasureRefused, match="needs a reason"):
        erase_participant(person, reason="   ")
    with pytest.raises(ErasureRefused, match="No participant has the Prolific id"):
        erase_by_prolific_id("nobodyPID", reason=REASON)
    BonusPayment.objects.filter(pk=payment.pk).update(state=BonusPayment.State.PAID)
    record = erase_participant(person, reason=REASON)
    assert record.counts["bonuses"] == 1 and not Participant.objects.filter(pk=person.pk).exists()


def test_erasure_and_export_have_their_own_permissions(data_dir):
    study = make_study(slug="perm", arms=("a",))
    person, _ = arrival.arrive(study, prolific(pid=PID))
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_participant", "change_participant"])
    )
    client = Client()
    client.force_login(staff)
    page = reverse("admin:studies_erasurerecord_erase")
    form = {"prolific_pid": PID, "reason": REASON, "confirm": "on"}
    assert client.post(page, form).status_code == 403
    changelist = reverse("admin:studies_participant_changelist")
    for action in ("erase_on_request", "access_request_export"):
        client.post(changelist, {"action": action, "_selected_action": [person.pk]})
    assert Participant.objects.filter(pk=person.pk).exists()

    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["erase_participant", "export_participant"])
    )
    staff = User.objects.get(pk=staff.pk)  # permissions are cached on the instance
    client.force_login(staff)
    exported = client.post(
        changelist, {"action": "access_request_export", "_selected_action": [person.pk]}
    )
    assert exported["Content-Type"] == "application/json" and PID in exported.content.decode()
    # The erase action asks for a reason first; a blank one is refused by the form.
    asked = client.post(changelist, {"action": "erase_on_request", "_selected_action": [person.pk]})
    assert asked.status_code == 200 and "reason" in asked.content.decode()
    blank = {
        "action": "erase_on_request",
        "_selected_action": [person.pk],
        "apply": "1",
        "reason": "",
        "confirm": "on",
    }
    client.post(changelist, blank)
    assert Participant.objects.filter(pk=person.pk).exists()
    client.post(changelist, {**blank, "reason": REASON})
    assert not Participant.objects.filter(pk=person.pk).exists()
    assert ErasureRecord.objects.get().erased_by == "staff"


def test_the_admin_deletes_no_participant_but_through_erasure(data_dir, admin_client):
    """Django's delete (the page and the bulk action) would drop the row and keep their files,
    with no audit record: even a superuser finds neither; erasure is the way."""
    study = make_study(slug="nodelete", arms=("a",))
    person, _ = arrival.arrive(study, prolific(pid=PID))
    page = reverse("admin:studies_participant_delete", args=[person.pk])
    assert admin_client.post(page, {"post": "yes"}).status_code == 403
    changelist = reverse("admin:studies_participant_changelist")
    bulk = {"action": "delete_selected", "_selected_action": [person.pk], "post": "yes"}
    admin_client.post(changelist, bulk)
    assert Participant.objects.filter(pk=person.pk).exists()
    assert "delete_selected" not in admin_client.get(changelist).content.decode()
    # nor by deleting their study (Django asks for the delete permission of what it cascades to)
    study_page = reverse("admin:studies_study_delete", args=[study.pk])
    refused = admin_client.post(study_page, {"post": "yes"}).content.decode()
    assert "Cannot delete study" in refused and "<li>participant</li>" in refused
    assert Participant.objects.filter(pk=person.pk).exists()


def test_a_short_prolific_id_takes_nothing_of_another_whose_id_holds_it(data_dir):
    """Text is matched by whole ids: erasing "p1" leaves "p10"'s problem, log line and events."""
    study = make_study(slug="short", arms=("a",))
    short, _ = arrival.arrive(study, prolific(pid="p1", session_id="s1"))
    longer, _ = arrival.arrive(study, prolific(pid="p10", session_id="s10"))
    from studies.models import StudyError

    StudyError.objects.create(study=study, title="x", detail="p10 saw a problem")
    (data_dir / "app.log").write_text("p10 arrived\np1 arrived\n")
    record = erase_participant(short, reason=REASON)
    assert record.counts["problems"] == 0 and record.counts["files"] == 1
    assert StudyError.objects.get().detail == "p10 saw a problem"
    assert (data_dir / "app.log").read_text() == "p10 arrived\n[erased]\n"
    assert Participant.objects.filter(pk=longer.pk).exists()


def test_model_files_in_the_data_folder_are_never_edited(data_dir):
    """The data folder also holds the base model, checkpoints and runs: a tokenizer's vocabulary
    line that is a short Prolific id as a word stays as it is; only logs, saved exports and
    Celery's folders are participants' files."""
    study = make_study(slug="vocab", arms=("a",))
    person, _ = arrival.arrive(study, prolific(pid="p", session_id="s1"))
    vocabulary = '{\n  "p": 96,\n  "q": 97\n}\n'
    for folder in ("models/SmolLM2-135M-Instruct", "checkpoints/run-1", "runs/run-1"):
        (data_dir / folder).mkdir(parents=True)
        (data_dir / folder / "tokenizer.json").write_text(vocabulary)
    (data_dir / "logs").mkdir()
    (data_dir / "logs" / "web.log").write_text("p arrived\n")
    record = erase_participant(person, reason=REASON)
    assert record.counts["files"] == 1
    assert (data_dir / "logs" / "web.log").read_text() == "[erased]\n"
    for folder in ("models/SmolLM2-135M-Instruct", "checkpoints/run-1", "runs/run-1"):
        assert (data_dir / folder / "tokenizer.json").read_text() == vocabulary


@pytest.mark.django_db(transaction=True)
def test_sqlite_keeps_no_erased_words_in_its_free_pages(data_dir):
    """SQLite leaves a deleted row's bytes in the file's free pages unless told to overwrite
    them (PRAGMA secure_delete): the embedded database file itself must not hold them."""
    if connection.vendor != "sqlite":
        # PostgreSQL's files are not the site's to read (its rows are checked above); what
        # protects the README's default database is the option every SQLite connection gets
        assert "PRAGMA secure_delete=ON" in settings.SQLITE_OPTIONS["init_command"]
        return
    study = make_study(slug="file", arms=("a",))
    person, _ = arrival.arrive(study, prolific(pid=PID))
    give_consent(person, True)
    store_user_message(person, "m-1", SAID * 20)
    erase_participant(person, reason=REASON)
    connection.close()
    name = Path(connection.settings_dict["NAME"])
    stored = b"".join(
        path.read_bytes() for path in name.parent.glob(name.name + "*") if path.is_file()
    )
    assert SAID.encode() not in stored and PID.encode() not in stored
