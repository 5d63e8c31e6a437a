"""A study's retention period (Study.retention_days): once it has passed for a participant (days
after their arrival), the periodic task purges what identifies them and keeps the rest under a
pseudonym, so the analysis still runs, and gives the same numbers, on pseudonymous ids.

Purged: the Prolific PID (a pseudonym replaces it, in stored analysis runs too, so a run re-done
from its stored inputs matches), the participant link's token (a new random one: the old link
opens nothing), the SESSION_ID (kept only where a paid bonus needs it as the payment record), the
answers to free-text items the study marks identifying (questionnaire and ratings), and the ids
in the admin log's object names, in stored Prolific webhooks about their submission, in bonus
lines Prolific refused and in the words of problems they met. Kept: arm, scenario, timestamps, messages, numeric answers,
outcome. A participant still on their way, or with a review or bonus not yet sent to Prolific,
is held back until that is done (paying them needs their ids).
"""

import json
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from studies.lib.lock_objects import lock_participants
from studies.models import (
    AnalysisRun,
    Bonus,
    BonusPayment,
    Item,
    Participant,
    ProlificEvent,
    RatingAssignment,
    Response,
    Review,
    Study,
    StudyError,
)

log = logging.getLogger(__name__)

PSEUDONYM_PREFIX = "anon-"
PURGED_TEXT = ""  # what an identifying free-text answer holds once purged


def pseudonym() -> str:
    """A random id with no tie to the person (nothing can turn it back into the PID)."""
    return PSEUDONYM_PREFIX + secrets.token_hex(10)


def _payment_pending():
    """Participants Prolific still has to be told about: a review not sent, a bonus not paid."""
    unsent_review = Review.objects.filter(participant=OuterRef("pk"), state=Review.State.PENDING)
    unpaid_bonus = Bonus.objects.filter(participant=OuterRef("pk")).exclude(
        payment__state__in=[BonusPayment.State.PAID, BonusPayment.State.FAILED]
    )
    return Q(Exists(unsent_review)) | Q(Exists(unpaid_bonus))


def due(study: Study, now: datetime | None = None):
    """The study's participants whose identifying data is due for purging now."""
    if not study.retention_days:
        return Participant.objects.none()
    now = now or timezone.now()
    return (
        study.participants.filter(
            purged_at__isnull=True, created_at__lte=now - timedelta(days=study.retention_days)
        )
        .exclude(status__in=Participant.UNFINISHED)
        .exclude(_payment_pending())
    )


@dataclass
class Schedule:
    """What the study page says about its retention."""

    days: int | None
    next_purge: datetime | None  # when the next participant's data is due (None: nobody)
    waiting: int  # participants not purged yet
    held_back: int  # due, but still on their way or waiting for a Prolific payment
    purged: int

    def describe(self) -> str:
        if not self.days:
            return "No retention period set: the study cannot go live without one."
        text = (
            f"Identifying data is purged {self.days} day(s) after each participant's arrival. "
            f"Purged so far: {self.purged}."
        )
        if self.next_purge is not None:
            text += (
                f" Next purge: {self.next_purge:%Y-%m-%d %H:%M} UTC; "
                f"{self.waiting} participant(s) not purged yet."
            )
        if self.held_back:
            text += (
                f" {self.held_back} held back until they finish or Prolific has their review "
                "or bonus."
            )
        return text


def schedule(study: Study, now: datetime | None = None) -> Schedule:
    now = now or timezone.now()
    everyone = study.participants.all()
    waiting = everyone.filter(purged_at__isnull=True)
    purged = everyone.filter(purged_at__isnull=False).count()
    if not study.retention_days:
        return Schedule(None, None, waiting.count(), 0, purged)
    period = timedelta(days=study.retention_days)
    first = waiting.aggregate(first=Min("created_at"))["first"]
    overdue = waiting.filter(created_at__lte=now - period).count()
    return Schedule(
        study.retention_days,
        max(first + period, now) if first else None,
        waiting.count(),
        overdue - due(study, now).count(),
        purged,
    )


def purge_due(now: datetime | None = None) -> dict[str, int]:
    """Every study's participants past its retention period, purged; participants per study."""
    now = now or timezone.now()
    done = {}
    for study in Study.objects.filter(retention_days__isnull=False):
        ids = list(due(study, now).values_list("pk", flat=True))
        if ids:
            done[study.slug] = purge(study, ids, now)
    return done


@transaction.atomic
def purge(study: Study, participant_ids: list[int], now: datetime | None = None) -> int:
    """Purge these participants of the study (those still due under their row locks)."""
    now = now or timezone.now()
    locked = list(
        lock_participants(due(study, now).filter(pk__in=participant_ids)).prefetch_related(
            "bonuses"
        )
    )
    renamed: dict[str, str] = {}
    for participant in locked:
        new = pseudonym()
        renamed[participant.prolific_pid] = new
        own = {participant.prolific_pid: new}
        participant.prolific_pid = new
        participant.token = uuid.uuid4()
        submission = participant.prolific_session_id
        if not participant.bonuses.all():  # a paid bonus's record names its submission
            participant.prolific_session_id = own[submission] = pseudonym()
        rename_in_events(submission, own)
        rename_in_problems(participant, own)
        participant.purged_at = now
        participant.save(
            update_fields=["prolific_pid", "token", "prolific_session_id", "purged_at"]
        )
    ids = [p.pk for p in locked]
    identifying = list(
        Item.objects.filter(questionnaire__study=study, identifying=True).values_list("pk", "key")
    )
    Response.objects.filter(
        participant_id__in=ids, item_id__in=[pk for pk, _ in identifying]
    ).update(value_text=PURGED_TEXT)
    purge_ratings(ids, {key for _, key in identifying})
    kind = ContentType.objects.get_for_model(Participant)
    for participant in locked:
        LogEntry.objects.filter(content_type=kind, object_id=str(participant.pk)).update(
            object_repr=participant.prolific_pid
        )
    rename_in_runs(study, renamed)
    for payment in BonusPayment.objects.filter(study=study).exclude(refused_lines=[]):
        # Lines Prolific refused are kept as uploaded: they name people by PID.
        lines = renamed_json(payment.refused_lines, renamed)
        if lines != payment.refused_lines:
            BonusPayment.objects.filter(pk=payment.pk).update(refused_lines=lines)
    if locked:
        log.info("retention: purged %d participant(s) of study %s", len(locked), study.pk)
    return len(locked)


def purge_ratings(participant_ids: list[int], keys: set[str]) -> None:
    """A rater's answers to identifying free-text items, emptied."""
    if not keys:
        return
    rated = RatingAssignment.objects.filter(participant_id__in=participant_ids).exclude(
        answers__isnull=True
    )
    for assignment in rated:
        answers = {k: (PURGED_TEXT if k in keys else v) for k, v in assignment.answers.items()}
        if answers != assignment.answers:
            RatingAssignment.objects.filter(pk=assignment.pk).update(answers=answers)


def renamed_json(value, renamed: dict[str, str]):
    """`value` (JSON) with each id in `renamed` replaced by its pseudonym."""
    text = json.dumps(value)
    for old, new in renamed.items():
        text = text.replace(json.dumps(old)[1:-1], new)
    return json.loads(text)


def rename_in_events(submission: str, renamed: dict[str, str]) -> None:
    """Prolific's stored webhooks about their submission name its id and their PID."""
    for event in ProlificEvent.objects.filter(resource_id=submission):
        ProlificEvent.objects.filter(pk=event.pk).update(
            payload=renamed_json(event.payload, renamed),
            resource_id=renamed.get(submission, submission),
            result=renamed_json(event.result, renamed),
        )


def rename_in_problems(participant: Participant, renamed: dict[str, str]) -> None:
    """A problem's words may quote the participant's ids (their paths never hold a token)."""
    for problem in StudyError.objects.filter(participant=participant):
        detail = renamed_json(problem.detail, renamed)
        if detail != problem.detail:
            StudyError.objects.filter(pk=problem.pk).update(detail=detail)


def rename_in_runs(study: Study, renamed: dict[str, str]) -> None:
    """Stored analysis runs name participants by PID (their inputs' participant column): the
    pseudonyms replace them, so a run re-done from its stored inputs gives the same report."""
    if not renamed:
        return
    for run in AnalysisRun.objects.filter(study=study):
        changed = {}
        for field in ("inputs", "results"):
            text = json.dumps(getattr(run, field))
            new = text
            for pid, alias in renamed.items():
                new = new.replace(pid, alias)
            if new != text:
                changed[field] = json.loads(new)
        if changed:
            AnalysisRun.objects.filter(pk=run.pk).update(**changed)
