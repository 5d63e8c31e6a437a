"""Stopping from inside the study ("stop taking part"), from the chat, the questionnaire or the
rater's page (and over the chat socket): the chat or rating ends at once, then the person is
asked whether the data gathered so far may be kept, and told what happens next with Prolific.

Every withdrawal is a Withdrawal row (it names no one, so it outlives an erasure): the monitor
counts them and the analysis lists them among its exclusions, never silently.
"""

import logging

from django.db import transaction
from django.utils import timezone

from studies.lib.flow_errors import FlowError
from studies.lib.lock_objects import lock_participant_with_page, lock_withdrawal
from studies.models import (
    COMPLETE_URL,
    Conversation,
    Participant,
    RatingAssignment,
    Withdrawal,
)
from studies.participation import problems
from studies.participation.complete import completion_code
from studies.privacy import erasure

log = logging.getLogger(__name__)

WITHDRAWN = "withdrawn"  # a Conversation's end_reason when its participant stopped taking part
ERASURE_REASON = "The participant withdrew from inside the study and asked that their data not "
ERASURE_REASON += "be kept."


@transaction.atomic
def withdraw(participant: Participant) -> Withdrawal:
    """Stop the participant's chat or rating now and record it; a second stop changes nothing.
    A step that cannot be stopped from (consent has its own decline; finished) is refused."""
    participant = lock_participant_with_page(participant.pk)
    if participant.status == Participant.Status.WITHDRAWN:
        return Withdrawal.objects.get(participant=participant)
    if participant.status not in Participant.CAN_WITHDRAW:
        raise FlowError(
            "Nothing to stop",
            "You are not taking part in this study at the moment, so there is nothing to stop.",
        )
    now = timezone.now()
    stage = participant.status
    if stage == Participant.Status.CHAT:
        Conversation.objects.filter(participant=participant, ended_at__isnull=True).update(
            ended_at=now, end_reason=WITHDRAWN
        )
        participant.chat_ended_at = participant.chat_ended_at or now
    # A rater's conversations not yet rated go back to the pool for other raters.
    participant.rating_assignments.filter(status=RatingAssignment.Status.ASSIGNED).update(
        status=RatingAssignment.Status.RELEASED
    )
    participant.status = Participant.Status.WITHDRAWN
    participant.save(update_fields=["status", "chat_ended_at"])
    return Withdrawal.objects.create(
        study=participant.study,
        participant=participant,
        arm_name=participant.arm.name,
        stage=stage,
        at=now,
        paid=bool(completion_code(participant)),
    )


def decide(participant: Participant, keep: bool, by_page: str = "") -> "NextStep":
    """Record whether the withdrawn participant lets their data be kept; when not, it is erased
    from everywhere parley keeps it (studies/privacy/erasure.py). Returns what they do next on
    Prolific, worked out before an erasure takes their record away. A decision is made once."""
    with transaction.atomic():
        participant = lock_participant_with_page(participant.pk)
        if participant.status != Participant.Status.WITHDRAWN:
            raise FlowError("Nothing to decide", "You have not stopped taking part in this study.")
        withdrawal = lock_withdrawal(participant)
        step = next_step(participant)
        if withdrawal.data_kept is not None:
            return step  # a double submit: the first answer stands
        withdrawal.data_kept, withdrawal.decided_at = keep, timezone.now()
        withdrawal.save(update_fields=["data_kept", "decided_at"])
    if not keep:
        step.erased = erase(participant, withdrawal, by_page)
    return step


def erase(participant: Participant, withdrawal: Withdrawal, path: str) -> bool:
    """The person's data, gone (the erasure keeps only what a payment record needs). Should it
    fail, their request stands recorded (data_kept False, erased_at blank) and the researcher
    is told on the monitor, who must complete it: it is never dropped quietly."""
    try:
        erasure.erase_participant(participant, reason=ERASURE_REASON, by="withdrawal")
    except Exception as error:  # noqa: BLE001 - the participant's page must still answer
        log.exception("erasure after withdrawal #%s failed", withdrawal.pk)
        problems.record(
            participant.study,
            None,  # the problem row must not point back at the person to be erased
            path,
            FlowError(
                "Erasure after a withdrawal not done",
                f"Withdrawal #{withdrawal.pk}: the participant asked that their data not be "
                f"kept, and erasing it failed ({type(error).__name__}). Erase participant "
                f"#{participant.pk} from the admin.",
            ),
        )
        return False
    Withdrawal.objects.filter(pk=withdrawal.pk).update(erased_at=timezone.now())
    return True


class NextStep:
    """What the withdrawn person does on Prolific: take the study's completion code back (its
    policy pays for partial participation), or return their submission."""

    def __init__(self, code: str, kept: bool | None):
        self.code = code
        self.kept = kept
        self.erased = False

    @property
    def completion_url(self) -> str | None:
        return COMPLETE_URL.format(code=self.code) if self.code else None

    @property
    def returns(self) -> bool:
        return not self.code


def next_step(participant: Participant) -> NextStep:
    withdrawal = getattr(participant, "withdrawal", None)
    return NextStep(completion_code(participant), withdrawal.data_kept if withdrawal else None)
