"""Prolific both ways: submission statuses in (webhook and periodic sync), the researcher's
decisions and bonuses out. Views, admin and tasks call these functions; the HTTP calls are in
studies/prolific/api.py.

A submission is matched to its Participant by the submission id, which is the SESSION_ID the
participant arrived with (a participant who returned and took the study again has a new one, so
the old submission's RETURNED frees nobody).
"""

import csv
import hashlib
import io
import json
import logging
import re
import statistics
import time
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from studies.lib.lock_objects import lock_bonus_payment, lock_participant
from studies.models import (
    Bonus,
    BonusPayment,
    Item,
    Participant,
    ProlificEvent,
    Review,
    Study,
)
from studies.prolific import api as prolific_api
from studies.prolific.api import AWAITING_REVIEW, Prolific, ProlificError, normal_status

log = logging.getLogger(__name__)

# Our status for a participant whose submission Prolific reopened (their place is freed).
FREED_AS = {
    prolific_api.RETURNED: Participant.Status.RETURNED,
    prolific_api.TIMED_OUT: Participant.Status.TIMED_OUT,
}


# --- statuses in --------------------------------------------------------------------------------


@transaction.atomic
def apply_status(participant: Participant, status: str) -> str:
    """Record the submission's Prolific status; RETURNED and TIMED-OUT free the participant's
    place (no longer in Participant.ACTIVE) and keep what they gave, flagged as partial."""
    status = normal_status(status)
    if status not in prolific_api.KNOWN_STATUSES:
        return f"{participant.prolific_pid}: unknown status {status[:40]!r}, not applied"
    participant = lock_participant(participant.pk)
    participant.prolific_status = status
    participant.prolific_synced_at = timezone.now()
    fields = ["prolific_status", "prolific_synced_at"]
    freed = FREED_AS.get(status)
    result = f"{participant.prolific_pid}: {status}"
    if freed and participant.status in (*Participant.ACTIVE, Participant.Status.TIMED_OUT):
        if participant.status != freed:
            result += f" (place freed, was {participant.status})"
        participant.status = freed
        participant.partial_data = True
        fields += ["status", "partial_data"]
        conversation = getattr(participant, "conversation", None)
        if conversation is not None and conversation.ended_at is None:
            conversation.ended_at, conversation.end_reason = timezone.now(), status.lower()
            conversation.save(update_fields=["ended_at", "end_reason"])
    participant.save(update_fields=fields)
    return result


def participant_of_submission(submission_id: str, study: Study | None = None):
    found = Participant.objects.filter(prolific_session_id=submission_id)
    if study is not None:
        found = found.filter(study=study)
    return found.first()


# --- the webhook ----------------------------------------------------------------------------------


class WebhookRefused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


# A timestamp as Prolific sends it: whole seconds (or milliseconds), perhaps with a fraction.
# float() alone takes "nan" (which passes every age comparison), "inf", "1_700_000_000", " 1e9 ".
TIMESTAMP = re.compile(r"[0-9]{1,16}(\.[0-9]{1,6})?")


def event_time(timestamp: str) -> float:
    """The request timestamp in seconds (Prolific's examples use seconds; milliseconds, which
    no source rules out, are recognised by their size). ValueError unless it is plain digits."""
    if not TIMESTAMP.fullmatch(timestamp):
        raise ValueError(f"not a timestamp: {timestamp[:40]!r}")
    value = float(timestamp)  # finite: at most 16 digits
    return value / 1000 if value > 1e11 else value


def delivery_digest(timestamp: str, event: dict) -> str:
    """What a signature vouches for (the timestamp and the event), hashed. Over the parsed event,
    not the raw bytes: a signature is also accepted over json.dumps of the body, so the same
    signature covers bodies that differ in spacing; they all have this one digest."""
    canonical = json.dumps(event, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{timestamp}\n{canonical}".encode()).hexdigest()


def receive_webhook(headers, body: bytes, now: float | None = None) -> str:
    """Verify and act on one delivery; returns what was done, or raises WebhookRefused (4xx).
    Acting and recording the event id and the delivery's digest commit together, so a delivery
    that fails is redone by Prolific's retry and one that succeeded is never done twice.

    A signed request can be replayed by whoever saw it, within the age window, with any
    X-Event-ID or none: its digest is kept (in the database, so every worker sees it; rows are
    never purged, which keeps it past the window) and a second request with the same digest is
    refused (409) unless it is Prolific's own redelivery under the same X-Event-ID (200, not
    acted on again)."""
    secret = settings.PROLIFIC_WEBHOOK_SECRET
    if not secret:
        raise WebhookRefused(503, "PROLIFIC_WEBHOOK_SECRET is not set")
    timestamp = headers.get("X-Prolific-Request-Timestamp", "")
    given = headers.get("X-Prolific-Request-Signature", "")
    if not prolific_api.signature_valid(secret, timestamp, body, given):
        raise WebhookRefused(403, "signature does not match")
    try:
        age = (time.time() if now is None else now) - event_time(timestamp)
    except ValueError:
        raise WebhookRefused(400, "timestamp is not a number") from None
    if not abs(age) <= settings.PROLIFIC_WEBHOOK_MAX_AGE:  # NaN compares false both ways
        raise WebhookRefused(400, "timestamp too old or in the future")
    try:
        event = json.loads(body)
    except ValueError:
        raise WebhookRefused(400, "body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookRefused(400, "body is not a JSON object")
    digest = delivery_digest(timestamp, event)
    # Retries carry the same X-Event-ID; without one, the signed request itself identifies it.
    given_id = headers.get("X-Event-ID", "").strip()[:128]
    event_id = given_id or "sig:" + digest
    try:
        with transaction.atomic():
            record = ProlificEvent.objects.create(
                event_id=event_id,
                digest=digest,
                event_type=str(event.get("event_type", ""))[:64],
                resource_id=str(event.get("resource_id", ""))[:64],
                payload=event,
            )
            record.result = act_on(event)[:200]
            record.save(update_fields=["result"])
    except IntegrityError:
        first = ProlificEvent.objects.filter(digest=digest).values_list("event_id", flat=True)
        if first.exists() and not (given_id and first.first() == given_id):
            raise WebhookRefused(409, "this signed request was already received") from None
        return f"event {event_id} already received"
    return record.result


def act_on(event: dict) -> str:
    """Every valid event is acknowledged; a submission's status change is applied."""
    kind = event.get("event_type")
    if kind != "submission.status.change":
        return f"{kind}: recorded"
    submission_id = str(event.get("resource_id", ""))
    participant = participant_of_submission(submission_id)
    if participant is None:
        return "submission of no participant here"
    status = normal_status(str(event.get("status", "")))
    if prolific_api.status_rank(status) < prolific_api.status_rank(participant.prolific_status):
        # An older event delivered late, or a real step back (UNREJECT, UNRETURN): Prolific's
        # own record decides; without the API the later status we hold stands.
        if not settings.PROLIFIC_API_TOKEN:
            return f"{status} after {participant.prolific_status}: out of order, ignored"
        try:
            with Prolific() as api:
                status = normal_status(api.submission(submission_id).get("status"))
        except ProlificError as error:  # the periodic sync will settle it
            return f"{status} after {participant.prolific_status}: not checked ({error.status})"
    return apply_status(participant, status)


# --- the periodic sync (both ways) -------------------------------------------------------------


def sync_study(study: Study, api: Prolific) -> dict:
    """Pull every submission's status, then push the decisions and bonuses still to send."""
    counts = {"submissions": 0, "changed": 0}
    if not study.prolific_study_id:
        return counts
    details = api.study(study.prolific_study_id)
    minutes = details.get("estimated_completion_time")
    if isinstance(minutes, int | float) and minutes != study.estimated_minutes:
        Study.objects.filter(pk=study.pk).update(estimated_minutes=int(minutes))
    ours = {p.prolific_session_id: p for p in study.participants.select_related("review")}
    for submission in api.submissions(study.prolific_study_id):
        counts["submissions"] += 1
        participant = ours.get(str(submission.get("id")))
        if participant is None:
            continue
        status = normal_status(submission.get("status"))
        if awaits_our_approval(participant, status):
            continue
        freeable = FREED_AS.get(status) and participant.status != FREED_AS[status]
        if status != participant.prolific_status or freeable:
            apply_status(participant, status)
            counts["changed"] += 1
    counts["reviews"] = push_reviews(study, api)
    for payment in study.bonus_payments.exclude(
        state__in=[BonusPayment.State.PAID, BonusPayment.State.FAILED]
    ):
        try:
            pay(payment.pk, api)
        except ProlificError as error:  # unknown outcome: the next sync reconciles it
            log.warning("bonus payment %s: %s", payment.pk, error)
    return counts


def sync_all(api: Prolific | None = None) -> dict:
    """Every study linked to Prolific; one study's failure does not stop the others."""
    results = {}
    if api is None:
        if not settings.PROLIFIC_API_TOKEN:
            return {"skipped": "PROLIFIC_API_TOKEN is not set"}
        api = Prolific()
    with api:
        for study in Study.objects.exclude(prolific_study_id="").exclude(status=Study.Status.DRAFT):
            try:
                results[study.slug] = sync_study(study, api)
            except ProlificError as error:
                log.warning("Prolific sync of %s: %s", study.slug, error)
                results[study.slug] = {"error": str(error)}
    return results


# --- decisions out: approve, reject -------------------------------------------------------------


def attention_failures(participant: Participant) -> int:
    failed = 0
    for response in participant.responses.filter(item__kind=Item.Kind.ATTENTION).select_related(
        "item"
    ):
        if response.value_number != float(response.item.expected_answer):
            failed += 1
    return failed


def attention_rejection_allowed(participant: Participant) -> bool:
    """Prolific's rule: one failed attention check allows a rejection in a study under 5
    minutes, two or more in longer ones. An unknown length counts as long (the stricter rule)."""
    minutes = participant.study.estimated_minutes
    needed = 1 if minutes is not None and minutes < 5 else 2
    return attention_failures(participant) >= needed


def exceptionally_fast(participant: Participant) -> bool:
    """Prolific's rule for TOO_QUICKLY: more than 3 SD below the mean completion time (of the
    study's completed participants, bots aside)."""
    durations = [
        (p.completed_at - p.created_at).total_seconds()
        for p in participant.study.participants.filter(
            status=Participant.Status.COMPLETED, is_bot=False, completed_at__isnull=False
        )
    ]
    if participant.completed_at is None or len(durations) < 3:
        return False
    mean = statistics.fmean(durations)
    spread = statistics.stdev(durations)
    return (participant.completed_at - participant.created_at).total_seconds() < mean - 3 * spread


# Rejection categories that Prolific's rules tie to a measurable condition: (test, why not).
RULES = {
    "FAILED_CHECK": (
        attention_rejection_allowed,
        "has too few failed attention checks for Prolific's rules (one under 5 minutes, else two)",
    ),
    "TOO_QUICKLY": (
        exceptionally_fast,
        "was not more than 3 SD faster than the mean completion time (Prolific's rule)",
    ),
}


def reviewable(participant: Participant) -> str | None:
    """Why the participant's submission cannot be decided now, or None."""
    review = getattr(participant, "review", None)
    if review is not None and review.state != Review.State.FAILED:
        return f"already {review.get_action_display().lower()}d ({review.get_state_display()})"
    status = participant.prolific_status
    if normal_status(status) != AWAITING_REVIEW:
        return f"is {status or 'not synced from Prolific'}, not {AWAITING_REVIEW}"
    return None


@transaction.atomic
def decide(participants, action: str, message: str = "", category: str = "") -> tuple[list, list]:
    """Queue a decision for each submission AWAITING REVIEW; returns (queued, [(p, why)])."""
    if action == Review.Action.REJECT:
        prolific_api.check_rejection(message, category)
    queued, skipped = [], []
    for participant in participants:
        participant = lock_participant(participant.pk)
        why = reviewable(participant)
        if why is None and category in RULES and not RULES[category][0](participant):
            why = RULES[category][1]
        if why:
            skipped.append((participant, why))
            continue
        Review.objects.update_or_create(
            participant=participant,
            defaults=dict(
                action=action,
                message=message.strip(),
                rejection_category=category,
                state=Review.State.PENDING,
                error="",
            ),
        )
        queued.append(participant)
    return queued, skipped


def push_reviews(study: Study, api: Prolific) -> int:
    """Send the pending decisions, approvals in bulk batches, one request after another.
    Transitions are idempotent on Prolific: resending after a crash changes nothing. Each sent
    decision's status is stored at once (the admin shows it before the next sync)."""
    pending = Review.objects.filter(
        participant__study=study, state=Review.State.PENDING
    ).select_related("participant")
    approvals = [r for r in pending if r.action == Review.Action.APPROVE]
    sent = 0
    for start in range(0, len(approvals), prolific_api.BULK_APPROVE_MAX):
        batch = approvals[start : start + prolific_api.BULK_APPROVE_MAX]
        sent += send(
            batch,
            lambda b=batch: api.bulk_approve([r.participant.prolific_session_id for r in b]),
        )
    for review in (r for r in pending if r.action == Review.Action.REJECT):
        sent += send(
            [review],
            lambda r=review: api.reject(
                r.participant.prolific_session_id, r.message, r.rejection_category
            ),
        )
    return sent


# What a sent decision makes of the submission. A rejection's answer is the submission, with its
# status; a bulk approval answers 202 with no statuses (Prolific approves them asynchronously).
DECIDED = {
    Review.Action.APPROVE: prolific_api.APPROVED,
    Review.Action.REJECT: prolific_api.REJECTED,
}


def send(reviews: list[Review], call) -> int:
    try:
        answer = call()
    except ProlificError as error:
        if not error.refused:
            raise  # no answer: left pending for the next try
        Review.objects.filter(pk__in=[r.pk for r in reviews]).update(
            state=Review.State.FAILED, error=str(error)
        )
        return 0
    Review.objects.filter(pk__in=[r.pk for r in reviews]).update(
        state=Review.State.SENT, sent_at=timezone.now(), error=""
    )
    answered = (answer or {}).get("status") if isinstance(answer, dict) else None
    for review in reviews:
        apply_status(review.participant, answered or DECIDED[review.action])
    return len(reviews)


def awaits_our_approval(participant: Participant, status: str) -> bool:
    """A submission we approved that Prolific still lists as before (its bulk approval runs
    asynchronously): the APPROVED we stored stands, as an approval is never undone."""
    review = getattr(participant, "review", None)
    return (
        participant.prolific_status == prolific_api.APPROVED
        and status in (AWAITING_REVIEW, prolific_api.PROCESSING)
        and review is not None
        and review.action == Review.Action.APPROVE
        and review.state == Review.State.SENT
    )


# --- bonuses ----------------------------------------------------------------------------------


class BonusError(ValueError):
    """Bonus lines that cannot be paid, each named."""


CENT = Decimal("0.01")
MAX_BONUS = Decimal("100.00")  # per participant: a typo guard (pounds/dollars)


def donation_of(participant: Participant) -> Decimal | None:
    """The P4G outcome's donation (what the participant chose to give), if any."""
    components = (participant.outcome or {}).get("components") or {}
    amount = components.get("donation")
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return None
    return Decimal(str(amount)).quantize(CENT)


def donation_match(participants, factor: Decimal = Decimal(1)) -> list[tuple[Participant, Decimal]]:
    """The P4G donation match: each completed participant's donation times `factor`; no line
    for those with no donation or a zero one."""
    lines = []
    for participant in participants:
        amount = donation_of(participant)
        if participant.status != Participant.Status.COMPLETED or not amount:
            continue
        amount = (amount * factor).quantize(CENT)
        if amount > 0:
            lines.append((participant, amount))
    return lines


def parse_amount(text: str) -> Decimal:
    try:
        amount = Decimal(text.strip().lstrip("£$"))
    except InvalidOperation:
        raise ValueError(f"amount {text.strip()!r} is not a number") from None
    if not amount.is_finite() or amount <= 0:
        raise ValueError(f"amount {text.strip()!r} must be more than 0")
    if amount != amount.quantize(CENT):
        raise ValueError(f"amount {text.strip()!r} has more than two decimals")
    if amount > MAX_BONUS:
        raise ValueError(f"amount {text.strip()!r} exceeds {MAX_BONUS}")
    return amount


def csv_lines(study: Study, text: str) -> list[tuple[Participant, Decimal]]:
    """`participant id, amount` rows (a header row is allowed; ids are PROLIFIC_PIDs or
    submission ids of this study); BonusError lists every bad row."""
    errors, lines, seen = [], [], set()
    rows = [row for row in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in row)]
    if rows and rows[0] and "participant" in rows[0][0].lower():
        rows = rows[1:]
    for number, row in enumerate(rows, 1):
        if len(row) != 2:
            errors.append(f"row {number}: expected 'participant id, amount', got {len(row)} cells")
            continue
        who = row[0].strip()
        try:
            amount = parse_amount(row[1])
        except ValueError as error:
            errors.append(f"row {number}: {error}")
            continue
        participant = study.participants.filter(prolific_pid=who).first() or (
            study.participants.filter(prolific_session_id=who).first()
        )
        if participant is None:
            errors.append(f"row {number}: {who!r} is not a participant of this study")
        elif participant.pk in seen:
            errors.append(f"row {number}: {who!r} appears twice")
        else:
            seen.add(participant.pk)
            lines.append((participant, amount))
    if errors:
        raise BonusError("; ".join(errors))
    if not lines:
        raise BonusError("the file has no bonus rows")
    return lines


@transaction.atomic
def create_payment(study: Study, lines, source: str) -> tuple[BonusPayment | None, list]:
    """A payment of the lines whose participant has no bonus in this study yet; returns it
    (None when nothing is new) and the participants skipped as already bonused."""
    if not study.prolific_study_id:
        raise BonusError("the study has no Prolific study id")
    taken = set(Bonus.objects.filter(study=study).values_list("participant_id", flat=True))
    new = [(p, amount) for p, amount in lines if p.pk not in taken]
    skipped = [p for p, _ in lines if p.pk in taken]
    if not new:
        return None, skipped
    payment = BonusPayment.objects.create(study=study, source=source[:200])
    try:
        with transaction.atomic():
            Bonus.objects.bulk_create(
                Bonus(payment=payment, study=study, participant=p, amount=amount)
                for p, amount in new
            )
    except IntegrityError:  # another payment took some of them meanwhile (the constraint)
        raise BonusError(
            "another bonus payment of some of these participants was made meanwhile: try again"
        ) from None
    return payment, skipped


def pay(payment_id: int, api: Prolific) -> BonusPayment:
    """Set up and pay one payment, exactly once however often it is run or wherever it stopped.

    1. Set up (pays nobody) under the payment's row lock, and store the setup id in the same
       transaction: a retry with a stored id never sets up again. A crash after Prolific answered
       but before the commit loses the id; the next run sets up again, which pays nobody.
    2. Mark PAYING and commit *before* the pay call. The pay call is not idempotent: a run that
       finds PAYING (the call timed out, Prolific answered 5xx, or the worker died after the call
       returned and before PAID was stored) never calls pay again blindly. It reconciles: if any
       bonused submission's `bonus_payments` shows its amount, the pay went through (one bulk
       operation) and it is PAID. Only when none shows it PROLIFIC_BONUS_CONFIRM_AFTER seconds
       after the call (pay is asynchronous) is it taken as unpaid and paid again.
    """
    payment = set_up(payment_id, api)
    if payment.state == BonusPayment.State.PAYING:
        payment = reconcile(payment, api)
    if payment.state != BonusPayment.State.SET_UP:
        return payment
    claimed = BonusPayment.objects.filter(pk=payment.pk, state=BonusPayment.State.SET_UP).update(
        state=BonusPayment.State.PAYING, pay_sent_at=timezone.now()
    )
    if not claimed:  # another run took it meanwhile
        return BonusPayment.objects.get(pk=payment.pk)
    try:
        api.pay_bonuses(payment.setup_id)
    except ProlificError as error:
        if error.refused:  # Prolific answered that it did not pay: safe to try again later
            BonusPayment.objects.filter(pk=payment.pk).update(
                state=BonusPayment.State.SET_UP, error=str(error)
            )
        raise
    BonusPayment.objects.filter(pk=payment.pk).update(
        state=BonusPayment.State.PAID, paid_at=timezone.now(), error=""
    )
    return BonusPayment.objects.get(pk=payment.pk)


@transaction.atomic
def set_up(payment_id: int, api: Prolific) -> BonusPayment:
    payment = lock_bonus_payment(payment_id)
    if payment.state != BonusPayment.State.NEW:
        return payment
    # By participant id: the rows come back in no order of their own (a join's plan decides).
    lines = [
        (b.participant.prolific_pid, b.amount)
        for b in payment.bonuses.select_related("participant").order_by("participant__prolific_pid")
    ]
    try:
        setup = api.set_up_bonuses(payment.study.prolific_study_id, lines)
    except ProlificError as error:
        if error.refused:  # e.g. an id that did not take part: the researcher must correct it
            payment.state, payment.error = BonusPayment.State.FAILED, str(error)
            payment.refused_lines = [[who, str(amount)] for who, amount in lines]
            payment.save(update_fields=["state", "error", "refused_lines"])
            payment.bonuses.all().delete()  # nobody was paid: they may be bonused again
            return payment
        raise
    payment.setup_id, payment.total_amount = setup.id, setup.total_amount
    payment.state, payment.set_up_at = BonusPayment.State.SET_UP, timezone.now()
    payment.save(update_fields=["setup_id", "total_amount", "state", "set_up_at"])
    return payment


def bonus_paid(submission: dict, amount: Decimal) -> bool:
    pence = int(amount * 100)
    for paid in submission.get("bonus_payments") or []:
        value = paid.get("amount") if isinstance(paid, dict) else paid
        if isinstance(value, int | float) and int(value) == pence:
            return True
    return False


def reconcile(payment: BonusPayment, api: Prolific) -> BonusPayment:
    """Decide a PAYING payment from the submissions (see pay)."""
    for bonus in payment.bonuses.select_related("participant"):
        submission = api.submission(bonus.participant.prolific_session_id)
        if bonus_paid(submission, bonus.amount):
            BonusPayment.objects.filter(pk=payment.pk).update(
                state=BonusPayment.State.PAID, paid_at=timezone.now(), error=""
            )
            return BonusPayment.objects.get(pk=payment.pk)
    waited = (timezone.now() - payment.pay_sent_at).total_seconds() if payment.pay_sent_at else 0
    if waited >= settings.PROLIFIC_BONUS_CONFIRM_AFTER:
        BonusPayment.objects.filter(pk=payment.pk, state=BonusPayment.State.PAYING).update(
            state=BonusPayment.State.SET_UP, error="pay not confirmed: paying again"
        )
    return BonusPayment.objects.get(pk=payment.pk)
