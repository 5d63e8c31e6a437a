"""Prolific both ways against a local fake of its API (tests/support/prolific_server.py): the webhook's
signature, replays and stale timestamps, the sync, decisions, bonuses paid exactly once,
completion codes, and the token and secret kept out of logs and the database."""

import json
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.core import serializers
from django.test import override_settings

from agents.paths import reference_dir
from studies.models import (
    Bonus,
    BonusPayment,
    CodeType,
    CompletionCode,
    Conversation,
    Ending,
    Item,
    Message,
    Participant,
    ProlificEvent,
    Response,
    Review,
)
from studies.participation.assign import least_filled_arm
from studies.participation.complete import completion_url
from studies.prolific import api as prolific_api
from studies.prolific import sync as prolific_sync
from tests.support.studies import LONG_MESSAGE, SECRET, TOKEN, join  # noqa: F401


def reference_text() -> str:
    folder = reference_dir() or Path("/work/shared/reference")
    return (folder / "prolific.md").read_text()


@pytest.fixture
def api(fake):
    with prolific_api.Prolific() as client:
        yield client


def deliver(client, event: dict, event_id="E1", timestamp=None, secret=SECRET, raw=None):
    body = raw if raw is not None else json.dumps(event).encode()
    timestamp = str(int(time.time()) if timestamp is None else timestamp)
    return signed_post(client, body, timestamp, {"X-Event-ID": event_id}, secret)


def signed_post(client, body: bytes, timestamp: str, headers: dict | None = None, secret=SECRET):
    """`body` sent with its signature and timestamp exactly as given, and `headers`."""
    return client.post(
        "/prolific/webhook/",
        data=body,
        content_type="application/json",
        headers={
            "X-Prolific-Request-Signature": prolific_api.signature(secret, timestamp, body),
            "X-Prolific-Request-Timestamp": timestamp,
            **(headers or {}),
        },
    )


def status_event(submission, status, pid="P"):
    return {
        "resource_id": submission,
        "event_type": "submission.status.change",
        "participant_id": pid,
        "status": status,
    }


# --- signature ------------------------------------------------------------------------------


def test_signature_matches_the_reference_check_vector():
    text = reference_text()
    vector = re.search(
        r"secret `([^`]+)`, timestamp `(\d+)`, body\s+`(\{.*?\})`\s+->\s+`([^`]+)`", text, re.S
    )
    assert vector, "the check vector is in the reference file"
    secret, timestamp, body, expected = vector.groups()
    assert prolific_api.signature(secret, timestamp, body.encode()) == expected
    assert prolific_api.signature_valid(secret, timestamp, body.encode(), expected)
    assert not prolific_api.signature_valid(
        secret, str(int(timestamp) + 1), body.encode(), expected
    )
    assert not prolific_api.signature_valid("other", timestamp, body.encode(), expected)
    # the documentation's example signs json.dumps of the parsed body: accepted as a fallback
    compact = json.dumps(json.loads(body), separators=(",", ":")).encode()
    assert prolific_api.signature_valid(secret, timestamp, compact, expected)


# --- webhook ----------------------------------------------------------------------------------


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_webhook_applies_a_signed_event_and_refuses_forged_and_stale_ones(client, linked):
    p = join(linked, "PID1", "SUB1", status=Participant.Status.COMPLETED)
    forged = deliver(client, status_event("SUB1", "APPROVED"), secret="not-the-secret")
    assert forged.status_code == 403
    stale = deliver(client, status_event("SUB1", "APPROVED"), timestamp=int(time.time()) - 3600)
    assert stale.status_code == 400
    future = deliver(client, status_event("SUB1", "APPROVED"), timestamp=int(time.time()) + 3600)
    assert future.status_code == 400
    unsigned = client.post("/prolific/webhook/", data=b"{}", content_type="application/json")
    assert unsigned.status_code == 403
    p.refresh_from_db()
    assert p.prolific_status == "" and not ProlificEvent.objects.exists()

    ok = deliver(client, status_event("SUB1", "AWAITING_REVIEW"), event_id="E1")
    assert ok.status_code == 200
    p.refresh_from_db()
    assert p.prolific_status == "AWAITING REVIEW"  # the filter spelling is normalised
    # without the final slash too (a POST cannot be redirected)
    body = json.dumps(status_event("SUB1", "APPROVED")).encode()
    ts = str(int(time.time()))
    response = client.post(
        "/prolific/webhook",
        data=body,
        content_type="application/json",
        headers={
            "X-Prolific-Request-Signature": prolific_api.signature(SECRET, ts, body),
            "X-Prolific-Request-Timestamp": ts,
            "X-Event-ID": "E2",
        },
    )
    assert response.status_code == 200
    p.refresh_from_db()
    assert p.prolific_status == "APPROVED"


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_a_replayed_event_is_acknowledged_without_acting_twice(client, linked):
    p = join(linked, "PID1", "SUB1")
    first = status_event("SUB1", "AWAITING REVIEW")
    assert deliver(client, first, event_id="EV-1").status_code == 200
    assert deliver(client, status_event("SUB1", "APPROVED"), event_id="EV-2").status_code == 200
    again = deliver(client, first, event_id="EV-1")  # Prolific's retry of the first
    assert again.status_code == 200 and b"already" in again.content
    p.refresh_from_db()
    assert p.prolific_status == "APPROVED"  # the old event was not applied again
    assert ProlificEvent.objects.filter(event_id="EV-1").count() == 1


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
@pytest.mark.parametrize(
    "first_id, replay_id",
    [("EV-1", "EV-forged"), ("EV-1", None), (None, "EV-forged"), (None, None)],
)
def test_a_replayed_signed_request_is_refused_whatever_its_event_id(
    client, linked, first_id, replay_id
):
    """Whoever saw one signed request could send it again within the 5 minutes with a new
    X-Event-ID or none: it was processed again. The same signed timestamp and body are refused
    (the digest is kept in the database, so every worker sees it)."""
    p = join(linked, "PID1", "SUB1")
    returned = json.dumps(status_event("SUB1", "RETURNED")).encode()
    ts = str(int(time.time()))
    first = signed_post(client, returned, ts, first_id and {"X-Event-ID": first_id})
    assert first.status_code == 200
    Participant.objects.filter(pk=p.pk).update(
        prolific_status="", status=Participant.Status.COMPLETED
    )
    replay = signed_post(client, returned, ts, replay_id and {"X-Event-ID": replay_id})
    assert replay.status_code == 409, replay.content
    p.refresh_from_db()
    assert p.prolific_status == "" and p.status == Participant.Status.COMPLETED  # not redone
    assert ProlificEvent.objects.count() == 1
    # Prolific's own redelivery (same X-Event-ID) is still acknowledged, not acted on
    if first_id:
        again = signed_post(client, returned, ts, {"X-Event-ID": first_id})
        assert again.status_code == 200 and b"already" in again.content


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_a_replay_respaced_under_the_same_signature_is_refused(client, linked):
    """The signature is also accepted over json.dumps of the body: a captured request sent again
    with its body respaced still verifies, so the replay check reads the event, not the bytes."""
    join(linked, "PID1", "SUB1")
    event = status_event("SUB1", "RETURNED")
    body = json.dumps(event).encode()
    ts = str(int(time.time()))
    assert signed_post(client, body, ts, {"X-Event-ID": "EV-1"}).status_code == 200
    respaced = json.dumps(event, separators=(",", ":")).encode()
    replay = client.post(
        "/prolific/webhook/",
        data=respaced,
        content_type="application/json",
        headers={
            "X-Prolific-Request-Signature": prolific_api.signature(SECRET, ts, body),
            "X-Prolific-Request-Timestamp": ts,
            "X-Event-ID": "EV-2",
        },
    )
    assert replay.status_code == 409, replay.content
    assert ProlificEvent.objects.count() == 1


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
@pytest.mark.parametrize(
    "timestamp",
    [
        "nan",
        "NaN",
        "inf",
        "-inf",
        "infinity",
        "",
        " {now}",
        "+{now}",
        "{now}e0",
        "{now}.",
        "1_{rest}",
    ],
)
def test_a_signed_timestamp_that_is_not_plain_digits_is_refused(client, linked, timestamp):
    """float("nan") passed the age check (every comparison with NaN is false); float() takes
    other spellings of a time too (signs, spaces, exponents, underscores): plain digits only."""
    join(linked, "PID1", "SUB1")
    body = json.dumps(status_event("SUB1", "APPROVED")).encode()
    now = str(int(time.time()))
    timestamp = timestamp.format(now=now, rest=now[1:])  # a time within the window
    response = signed_post(client, body, timestamp, {"X-Event-ID": "E-nan"})
    assert response.status_code in (400, 403), response.content
    assert not ProlificEvent.objects.exists()
    assert prolific_sync.event_time(str(int(time.time() * 1000))) == pytest.approx(time.time(), 5)


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_every_valid_event_gets_2xx(client, linked):
    for n, event in enumerate(
        [
            {"resource_id": "ST1", "event_type": "study.status.change", "status": "PAUSED"},
            {"resource_id": "ST1", "event_type": "study.has_high_return_rate"},
            {"resource_id": "X", "event_type": "something.new.later"},
            status_event("UNKNOWN-SUBMISSION", "RETURNED"),
        ]
    ):
        assert deliver(client, event, event_id=f"V{n}").status_code == 200
    assert ProlificEvent.objects.count() == 4
    bad = deliver(client, {}, raw=b"not json", event_id="V9")
    assert bad.status_code == 400


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET, PROLIFIC_API_TOKEN="")
def test_an_unknown_status_is_acknowledged_and_not_applied(client, linked):
    p = join(linked, "PID1", "SUB1")
    for n, status in enumerate(["SOMETHING NEW", "X" * 80]):  # the second outgrows the column
        response = deliver(client, status_event("SUB1", status), event_id=f"U{n}")
        assert response.status_code == 200 and b"unknown status" in response.content
    p.refresh_from_db()
    assert p.prolific_status == ""
    # it did not stand, as a final status would, in the way of the real ones that follow
    assert (
        deliver(client, status_event("SUB1", "AWAITING REVIEW"), event_id="U9").status_code == 200
    )
    p.refresh_from_db()
    assert p.prolific_status == "AWAITING REVIEW"


@pytest.mark.parametrize(
    "status, ours",
    [("RETURNED", "returned"), ("TIMED-OUT", "timed_out"), ("TIMED_OUT", "timed_out")],
)
@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_returned_and_timed_out_free_the_place_and_keep_the_data(client, linked, status, ours):
    arm_a, arm_b = linked.arms.all()
    join(linked, "PB", "SUBB", status=Participant.Status.CHAT, arm=arm_b)
    p = join(linked, "PA", "SUBA", status=Participant.Status.CHAT, arm=arm_a)
    conversation = Conversation.objects.create(participant=p)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="hello")
    assert deliver(client, status_event("SUBA", status)).status_code == 200
    p.refresh_from_db()
    assert p.status == ours and p.status not in Participant.ACTIVE
    assert p.partial_data
    assert p.conversation.messages.get().content == "hello"  # kept
    assert least_filled_arm(linked) == arm_a  # the place is free again
    page = client.get(f"/p/{p.token}/").content.decode()
    assert ("You returned this study" in page) == (ours == "returned")


# --- sync, both ways ------------------------------------------------------------------------


def test_sync_pulls_statuses_over_pages_and_pushes_decisions(fake, api, linked):
    fake.add_study("STUDYP", minutes=4)
    for n in range(7):
        fake.add_submission(f"SUB{n}", f"PID{n}", "STUDYP", status="AWAITING REVIEW")
        join(linked, f"PID{n}", f"SUB{n}")
    fake.submissions["SUB5"]["status"] = "RETURNED"
    fake.submissions["SUB6"]["status"] = "TIMED-OUT"
    fake.add_submission("OLD0", "PID0", "STUDYP", status="RETURNED")  # an earlier, returned try
    original = api.submissions
    api.submissions = lambda study_id: original(study_id, page_size=3)  # several pages

    counts = prolific_sync.sync_study(linked, api)
    assert counts["submissions"] == 8 and counts["changed"] == 7
    linked.refresh_from_db()
    assert linked.estimated_minutes == 4
    by_pid = {p.prolific_pid: p for p in linked.participants.all()}
    assert by_pid["PID0"].status == "completed"  # OLD0 is not its submission
    assert by_pid["PID5"].status == "returned" and by_pid["PID6"].status == "timed_out"
    assert by_pid["PID1"].prolific_status == "AWAITING REVIEW"

    queued, skipped = prolific_sync.decide(linked.participants.all(), Review.Action.APPROVE)
    assert {p.prolific_pid for p in queued} == {f"PID{n}" for n in range(5)}
    assert {p.prolific_pid for p, _ in skipped} == {"PID5", "PID6"}
    assert all("not AWAITING REVIEW" in why for _, why in skipped)
    prolific_sync.sync_study(linked, api)  # pushes the approvals
    assert [fake.submissions[f"SUB{n}"]["status"] for n in range(5)] == ["APPROVED"] * 5
    assert len(fake.called("POST", "bulk-approve")) == 1
    prolific_sync.sync_study(linked, api)  # nothing pending: nothing sent again
    assert len(fake.called("POST", "bulk-approve")) == 1
    assert linked.participants.get(prolific_pid="PID1").prolific_status == "APPROVED"
    again, skipped = prolific_sync.decide(linked.participants.all(), Review.Action.APPROVE)
    assert again == [] and len(skipped) == 7


def test_rejection_needs_the_message_and_a_category(fake, api, linked):
    fake.add_study("STUDYP")
    fake.add_submission("SUB1", "PID1", "STUDYP", status="AWAITING REVIEW")
    p = join(linked, "PID1", "SUB1", prolific_status="AWAITING REVIEW")
    with pytest.raises(ValueError, match="100 characters"):
        prolific_sync.decide([p], Review.Action.REJECT, "too short", "LOW_EFFORT")
    with pytest.raises(ValueError, match="category"):
        prolific_sync.decide([p], Review.Action.REJECT, LONG_MESSAGE, "BORED")
    assert not Review.objects.exists()
    queued, _ = prolific_sync.decide([p], Review.Action.REJECT, LONG_MESSAGE, "LOW_EFFORT")
    assert queued == [p]
    assert prolific_sync.push_reviews(linked, api) == 1
    call = fake.called("POST", "SUB1/transition")[0][2]
    assert call == {
        "action": "REJECT",
        "message": LONG_MESSAGE,
        "rejection_category": "LOW_EFFORT",
    }
    assert fake.submissions["SUB1"]["status"] == "REJECTED"
    assert Review.objects.get().state == Review.State.SENT


def fail_checks(study, participant, failures: int):
    q = study.questionnaire
    for n in range(2):
        item = Item.objects.create(
            questionnaire=q,
            order=10 + n,
            key=f"check{n}",
            kind="attention",
            expected_answer="3",
            prompt="Choose 3",
        )
        Response.objects.create(
            participant=participant, item=item, value_number=1 if n < failures else 3
        )
    attn = q.items.get(key="attn")
    Response.objects.create(participant=participant, item=attn, value_number=2)
    participant.attention_passed = failures == 0
    participant.save()


@pytest.mark.parametrize(
    "minutes, failures, allowed",
    [
        (4, 1, True),
        (10, 1, False),
        (10, 2, True),
        (None, 1, False),
        (None, 2, True),
        (4, 0, False),
    ],
)
def test_attention_rejections_only_as_prolific_allows(linked, minutes, failures, allowed):
    linked.estimated_minutes = minutes
    linked.save()
    p = join(linked, "PID1", "SUB1", prolific_status="AWAITING REVIEW")
    fail_checks(linked, p, failures)
    assert prolific_sync.attention_rejection_allowed(p) is allowed
    queued, skipped = prolific_sync.decide([p], Review.Action.REJECT, LONG_MESSAGE, "FAILED_CHECK")
    assert bool(queued) is allowed
    CompletionCode.objects.create(
        study=linked, code_type="FAILED_ATTENTION_CHECK", code="FAILAC", ending="failed_attention"
    )
    p.refresh_from_db()
    expected = "FAILAC" if allowed else "DONE123"
    assert completion_url(p).endswith(f"cc={expected}")


# --- bonuses, exactly once -------------------------------------------------------------------


def p4g_participants(study, fake, donations, numbers=None):
    people = []
    for n, donation in zip(numbers or range(len(donations)), donations, strict=True):
        sid, pid = f"SUB{n}", f"PID{n}"
        fake.add_submission(sid, pid, study.prolific_study_id, status="AWAITING REVIEW")
        outcome = {"reward": 0, "success": bool(donation), "components": {"donation": donation}}
        people.append(join(study, pid, sid, outcome=outcome))
    return people


def test_donation_match_rule(fake, linked):
    people = p4g_participants(linked, fake, [1.5, 0.0, None, 0.25])
    people.append(
        join(
            linked,
            "PIDX",
            "SUBX",
            status=Participant.Status.CHAT,
            outcome={"components": {"donation": 2.0}},
        )
    )
    lines = prolific_sync.donation_match(linked.participants.all())
    assert sorted((p.prolific_pid, a) for p, a in lines) == [
        ("PID0", Decimal("1.50")),
        ("PID3", Decimal("0.25")),
    ]
    doubled = prolific_sync.donation_match(linked.participants.all(), Decimal("2"))
    assert sorted(a for _, a in doubled) == [Decimal("0.50"), Decimal("3.00")]


def test_bonus_paid_once_even_when_run_again(fake, api, linked):
    fake.add_study("STUDYP")
    p4g_participants(linked, fake, [0.5, 1.5], numbers=[1, 0])  # arrived out of id order
    lines = prolific_sync.donation_match(linked.participants.all())
    payment, _ = prolific_sync.create_payment(linked, lines, "rule")
    assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.PAID
    for _ in range(3):  # a retried job, a redelivered task, the periodic sync
        prolific_sync.pay(payment.pk, api)
        prolific_sync.sync_study(linked, api)
    assert len(fake.setups) == 1 and len(fake.pays) == 1
    setup = fake.called("POST", "bonus-payments")[0][2]  # the file lists them by participant id
    assert setup == {"study_id": "STUDYP", "csv_bonuses": "PID0,1.50\nPID1,0.50"}
    assert fake.submissions["SUB0"]["bonus_payments"] == [150]
    # the same participants again (another rule run, or a CSV naming them) are skipped
    again, skipped = prolific_sync.create_payment(linked, lines, "rule again")
    assert again is None and len(skipped) == 2


@pytest.mark.parametrize("fault", ["worker dies", "server fails before paying"])
def test_retry_pays_an_existing_setup_and_never_sets_up_twice(fake, api, linked, fault):
    fake.add_study("STUDYP")
    p4g_participants(linked, fake, [1.0])
    payment, _ = prolific_sync.create_payment(
        linked, prolific_sync.donation_match(linked.participants.all()), "rule"
    )
    real_pay = api.pay_bonuses
    if fault == "worker dies":
        api.pay_bonuses = lambda setup_id: (_ for _ in ()).throw(RuntimeError("worker killed"))
    else:
        fake.pay_fault = "before"  # set up, then the pay call fails on Prolific's side
    with pytest.raises((RuntimeError, prolific_api.ProlificError)):
        prolific_sync.pay(payment.pk, api)
    payment.refresh_from_db()
    assert payment.state == BonusPayment.State.PAYING and payment.setup_id
    # nothing was paid, but the run cannot know it: the retry must not pay blindly
    api.pay_bonuses, fake.pay_fault = real_pay, None
    assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.PAYING
    assert fake.pays == []
    with override_settings(PROLIFIC_BONUS_CONFIRM_AFTER=0):  # nothing shows it: unpaid
        assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.PAID
        assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.PAID
    assert len(fake.setups) == 1 and fake.pays == [payment.setup_id]
    assert fake.submissions["SUB0"]["bonus_payments"] == [100]


def test_the_celery_job_retried_pays_once(fake, linked):
    from studies import tasks

    fake.add_study("STUDYP")
    p4g_participants(linked, fake, [0.75])
    payment, _ = prolific_sync.create_payment(
        linked, prolific_sync.donation_match(linked.participants.all()), "rule"
    )
    fake.pay_fault = "after"  # paid, but the answer is an error: the job retries itself
    # (run eagerly, Celery's retry runs again at once: it reconciles instead of paying again)
    assert tasks.pay_prolific_bonuses.apply(args=(payment.pk,)).get() == "paid"
    fake.pay_fault = None
    with override_settings(PROLIFIC_BONUS_CONFIRM_AFTER=0):  # a redelivery of the same message
        assert tasks.pay_prolific_bonuses.apply(args=(payment.pk,)).get() == "paid"
    assert len(fake.setups) == 1 and len(fake.pays) == 1
    assert fake.submissions["SUB0"]["bonus_payments"] == [75]


@pytest.mark.parametrize("fault", ["after", "crash-after-return"])
def test_a_pay_whose_answer_is_lost_is_reconciled_not_paid_again(fake, api, linked, fault):
    fake.add_study("STUDYP")
    p4g_participants(linked, fake, [2.0, 1.25])
    payment, _ = prolific_sync.create_payment(
        linked, prolific_sync.donation_match(linked.participants.all()), "rule"
    )
    real_pay = api.pay_bonuses
    if fault == "after":
        fake.pay_fault = "after"  # Prolific paid, then its answer was a 500
    else:

        def pay_then_crash(setup_id):  # the worker dies after pay returned, before PAID is stored
            real_pay(setup_id)
            raise SystemExit("killed")

        api.pay_bonuses = pay_then_crash
    with pytest.raises((prolific_api.ProlificError, SystemExit)):
        prolific_sync.pay(payment.pk, api)
    assert BonusPayment.objects.get().state == BonusPayment.State.PAYING
    fake.pay_fault, api.pay_bonuses = None, real_pay
    with override_settings(PROLIFIC_BONUS_CONFIRM_AFTER=0):
        assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.PAID
        prolific_sync.sync_study(linked, api)
    assert len(fake.pays) == 1 and len(fake.setups) == 1
    assert fake.submissions["SUB0"]["bonus_payments"] == [200]


def test_a_refused_setup_is_failed_with_the_reason(fake, api, linked):
    fake.add_study("STUDYP")
    p = join(linked, "NOTONPROLIFIC", "SUBZ")
    payment, _ = prolific_sync.create_payment(linked, [(p, Decimal("1.00"))], "csv")
    assert prolific_sync.pay(payment.pk, api).state == BonusPayment.State.FAILED
    payment.refresh_from_db()
    assert "did not take part" in payment.error and fake.pays == []
    assert payment.refused_lines == [["NOTONPROLIFIC", "1.00"]]
    # nobody was paid, so a corrected payment may bonus the participant
    again, skipped = prolific_sync.create_payment(linked, [(p, Decimal("1.00"))], "fixed")
    assert again is not None and skipped == []


def test_csv_bonuses_are_validated(linked):
    join(linked, "PID1", "SUB1")
    join(linked, "PID2", "SUB2")
    lines = prolific_sync.csv_lines(linked, "participant_id,amount\nPID1,1.50\nSUB2,0.75\n")
    assert [(p.prolific_pid, a) for p, a in lines] == [
        ("PID1", Decimal("1.50")),
        ("PID2", Decimal("0.75")),
    ]
    bad = "PID1,abc\nPID2,-1\nNOBODY,1\nPID1,1.234\nPID2\nPID2,1\nPID2,2\n"
    with pytest.raises(prolific_sync.BonusError) as error:
        prolific_sync.csv_lines(linked, bad)
    message = str(error.value)
    for expected in [
        "row 1: amount 'abc' is not a number",
        "row 2: amount '-1' must be more than 0",
        "row 3: 'NOBODY' is not a participant",
        "row 4: amount '1.234' has more than two decimals",
        "row 5: expected",
        "row 7: 'PID2' appears twice",
    ]:
        assert expected in message
    with pytest.raises(prolific_sync.BonusError, match="no bonus rows"):
        prolific_sync.csv_lines(linked, "participant_id,amount\n")


# --- completion codes -----------------------------------------------------------------------


def test_every_code_type_redirects_with_its_code(client, linked):
    CompletionCode.objects.create(study=linked, code_type=CodeType.FIXED_SCREENOUT, code="SCR1")
    linked.other_code = "PROB1"
    linked.save()
    codes = {(c.code_type, c.ending): c.code for c in linked.completion_codes.all()}
    assert codes == {
        ("COMPLETED", "completed"): "DONE123",
        ("NO_CONSENT", "no_consent"): "NOCONS",
        ("OTHER", "timed_out"): "LATE",
        ("OTHER", "problem"): "PROB1",
        ("FIXED_SCREENOUT", ""): "SCR1",  # used on Prolific only: listed with its redirect
    }
    screenout = linked.completion_codes.get(code="SCR1")
    assert screenout.redirect_url == "https://app.prolific.com/submissions/complete?cc=SCR1"
    for status, code in [("completed", "DONE123"), ("no_consent", "NOCONS"), ("timed_out", "LATE")]:
        p = join(linked, f"PID-{status}", f"S-{status}", status=status)
        response = client.get(f"/p/{p.token}/done/")
        assert response.status_code == 302
        assert response["Location"] == f"https://app.prolific.com/submissions/complete?cc={code}"
    returned = join(linked, "PIDR", "SR", status=Participant.Status.RETURNED)
    assert completion_url(returned) is None
    # the old fields still set and read the rows; an ending without a code falls back to OTHER
    linked.timeout_code = "LATE2"
    linked.no_consent_code = ""
    linked.save()
    assert linked.code(Ending.TIMED_OUT) == "LATE2" and linked.timeout_code == "LATE2"
    assert not linked.completion_codes.filter(ending="no_consent").exists()
    declined = linked.participants.get(prolific_pid="PID-no_consent")
    assert completion_url(declined).endswith("cc=PROB1")


def test_one_code_per_ending_in_the_admin(admin_client, linked):
    from django.urls import reverse

    from tests.support.studies import change_form_data

    url = reverse("admin:studies_study_change", args=[linked.pk])
    data = change_form_data(admin_client, url)
    n = int(data["completion_codes-TOTAL_FORMS"])
    data.update(
        {
            "completion_codes-TOTAL_FORMS": str(n + 1),
            f"completion_codes-{n}-code_type": "COMPLETED",
            f"completion_codes-{n}-code": "SECOND",
            f"completion_codes-{n}-ending": "completed",
        }
    )
    response = admin_client.post(url, data)
    assert response.status_code == 200 and b"One code per ending" in response.content
    data[f"completion_codes-{n}-ending"] = ""  # a second COMPLETED code, used on Prolific only
    assert admin_client.post(url, data).status_code == 302
    assert linked.completion_code == "DONE123"
    assert linked.completion_codes.filter(code="SECOND", ending="").exists()


# --- secrets --------------------------------------------------------------------------------


def test_token_and_secret_never_logged_stored_or_shown(fake, api, linked, client, caplog):
    caplog.set_level(logging.DEBUG)
    fake.add_study("STUDYP")
    p4g_participants(linked, fake, [1.0])
    linked.participants.update(prolific_status="AWAITING REVIEW")
    deliver(client, status_event("SUB0", "AWAITING REVIEW"), event_id="S1")
    deliver(client, status_event("SUB0", "APPROVED"), secret="forged", event_id="S2")
    prolific_sync.decide(linked.participants.all(), Review.Action.APPROVE)
    payment, _ = prolific_sync.create_payment(
        linked, prolific_sync.donation_match(linked.participants.all()), "rule"
    )
    prolific_sync.sync_study(linked, api)
    with override_settings(PROLIFIC_API_TOKEN="wrong-token-xyz"):
        with prolific_api.Prolific() as bad:
            with pytest.raises(prolific_api.ProlificError) as error:
                bad.me()
            shown = [repr(bad), str(error.value), repr(error.value)]
    assert error.value.status == 401
    assert prolific_sync.sync_all(api)  # logs a sync round
    dump = serializers.serialize(
        "json",
        [
            *ProlificEvent.objects.all(),
            *Participant.objects.all(),
            *Review.objects.all(),
            *BonusPayment.objects.all(),
            *Bonus.objects.all(),
        ],
    )
    for secret in (TOKEN, SECRET, "wrong-token-xyz"):
        assert secret not in caplog.text
        assert secret not in dump
        assert not any(secret in text for text in shown + [repr(api)])
    assert BonusPayment.objects.get().state == BonusPayment.State.PAID


def test_the_old_code_fields_become_rows_of_their_code_types(transactional_db):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = (
        [("studies", "0007_outcome_feedback")],
        [("studies", "0008_prolific")],
    )
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps.get_model("studies", "Study")
    old.objects.create(
        slug="old",
        title="Old",
        completion_code="C1",
        no_consent_code="",
        timeout_code="T9",
        other_code="T9",
    )
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(after)
    new = executor.loader.project_state(after).apps.get_model("studies", "CompletionCode")
    rows = set(new.objects.filter(study__slug="old").values_list("ending", "code_type", "code"))
    assert rows == {
        ("completed", "COMPLETED", "C1"),
        ("timed_out", "OTHER", "T9"),
        ("problem", "OTHER", "T9"),
    }
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@override_settings(PROLIFIC_WEBHOOK_SECRET=SECRET, PROLIFIC_API_TOKEN="")
def test_an_event_delivered_late_does_not_move_a_submission_back(client, linked):
    p = join(linked, "PID1", "SUB1")
    assert deliver(client, status_event("SUB1", "APPROVED"), event_id="N2").status_code == 200
    late = deliver(client, status_event("SUB1", "AWAITING REVIEW"), event_id="N1")
    assert late.status_code == 200 and b"out of order" in late.content
    p.refresh_from_db()
    assert p.prolific_status == "APPROVED"


def test_a_step_back_is_checked_with_prolific(client, fake, linked):
    fake.add_study("STUDYP")
    fake.add_submission("SUB1", "PID1", "STUDYP", status="AWAITING REVIEW")  # unrejected
    p = join(linked, "PID1", "SUB1", prolific_status="REJECTED")
    assert (
        deliver(client, status_event("SUB1", "AWAITING REVIEW"), event_id="U1").status_code == 200
    )
    p.refresh_from_db()
    assert p.prolific_status == "AWAITING REVIEW"
    assert fake.called("GET", "/submissions/SUB1")


def test_too_quickly_only_more_than_three_sd_below_the_mean(linked):
    from datetime import timedelta

    people = []
    for n, seconds in enumerate([600, 590, 610, 605, 595, 600, 620, 580, 600, 615, 585, 400, 10]):
        p = join(linked, f"PID{n}", f"SUB{n}", prolific_status="AWAITING REVIEW")
        Participant.objects.filter(pk=p.pk).update(
            completed_at=p.created_at + timedelta(seconds=seconds)
        )
        p.refresh_from_db()
        people.append(p)
    assert [prolific_sync.exceptionally_fast(p) for p in people] == [False] * 12 + [True]
    queued, skipped = prolific_sync.decide(
        people[-2:], Review.Action.REJECT, LONG_MESSAGE, "TOO_QUICKLY"
    )
    assert queued == [people[-1]] and "3 SD" in skipped[0][1]


def test_429_is_retried_with_back_off_and_errors_explain(fake, api, monkeypatch):
    monkeypatch.setattr(prolific_api.time, "sleep", lambda s: None)
    fake.add_study("STUDYP")
    fake.fail_next = [429, 429]
    assert api.study("STUDYP")["id"] == "STUDYP"
    assert len(fake.called("GET", "/studies/STUDYP")) == 3
    with pytest.raises(prolific_api.ProlificError) as error:
        api.study("NOPE")
    assert error.value.status == 404 and "No such study" in str(error.value)
    assert error.value.refused


def test_a_busy_answer_waits_at_least_its_retry_after(fake, api):
    """429 and 503 honour Retry-After (seconds, or an HTTP date): the next try is not sooner."""
    fake.add_study("STUDYP")
    fake.fail_next = [(429, "2"), (503, "3")]  # longer than the back-off's 1 and 2 s
    assert api.study("STUDYP")["id"] == "STUDYP"
    assert len(fake.called("GET", "/studies/STUDYP")) == 3
    gaps = [b - a for a, b in zip(fake.times, fake.times[1:], strict=False)]
    assert gaps[0] >= 2.0 and gaps[1] >= 3.0, gaps


def test_retry_after_reads_seconds_and_http_dates():
    from email.utils import format_datetime

    def answer(value):
        return httpx.Response(429, headers={"Retry-After": value} if value is not None else {})

    assert prolific_api.retry_after(answer("3")) == 3.0
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 28 <= prolific_api.retry_after(answer(soon)) <= 30
    past = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
    assert prolific_api.retry_after(answer(past)) == 0.0
    assert prolific_api.retry_after(answer("soon")) is None
    assert prolific_api.retry_after(answer(None)) is None


def test_a_retry_after_longer_than_a_call_waits_fails_at_once(fake, api, monkeypatch):
    slept = []
    monkeypatch.setattr(prolific_api.time, "sleep", slept.append)
    fake.add_study("STUDYP")
    fake.fail_next = [(429, "3600")]
    with pytest.raises(prolific_api.ProlificError) as error:
        api.study("STUDYP")
    assert error.value.status == 429 and "retry after 3600 s" in str(error.value)
    assert len(fake.called("GET", "/studies/STUDYP")) == 1 and slept == []
    # without the header: exponential back-off; the pay call (not repeatable) not on 503
    fake.fail_next = [429, 503]
    assert api.study("STUDYP")["id"] == "STUDYP" and slept == [1.0, 2.0]
    fake.fail_next = [503]
    with pytest.raises(prolific_api.ProlificError) as error:
        api.pay_bonuses("nope")
    assert error.value.status == 503 and len(fake.called("POST", "/pay")) == 1


def test_the_periodic_sync_is_on_celery_beat():
    from parley.celery import app

    entries = [
        e for e in app.conf.beat_schedule.values() if e["task"] == "studies.tasks.sync_prolific"
    ]
    assert len(entries) == 1 and entries[0]["schedule"] > 0


@override_settings(PROLIFIC_API_TOKEN=TOKEN, PROLIFIC_WEBHOOK_SECRET=SECRET)
def test_the_error_page_hides_the_token_and_the_secret():
    from django.views.debug import SafeExceptionReporterFilter

    shown = str(SafeExceptionReporterFilter().get_safe_settings())
    assert TOKEN not in shown and SECRET not in shown


def test_a_next_link_to_another_host_is_not_followed(api):
    assert api.same_origin(f"{api.base_url}/api/v1/x/?offset=2").path == "/api/v1/x/"
    assert api.same_origin("/api/v1/x/?offset=2").path == "/api/v1/x/"
    with pytest.raises(prolific_api.ProlificError, match="another host"):
        api.same_origin("https://evil.example/api/v1/x/")
