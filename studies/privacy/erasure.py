"""Erasure on request (GDPR Art. 17): one person's data goes from every place parley keeps it,
and an ErasureRecord says what went (counts per place), when, by whom and why, without the data.

The places (studies/privacy/places.py, one registry shared with the per-person export):

- studies_participant: the Prolific id, study and session (submission) ids, the token, arm,
  status, outcome, times: the row is deleted.
- studies_conversation, studies_message: their conversation, its Domain state, every message.
- studies_response: their questionnaire answers.
- studies_ratingassignment: the conversations they rated and their answers (as a rater).
- studies_ratedconversation (+ the ratings of it): redacted copies of their conversation in any
  study's annotation pool, and every other rater's rating of those copies.
- studies_studyerror: problems they met, and any whose path or traceback names them.
- studies_analysisrun: stored runs' inputs (the participant table by Prolific id, an annotation
  study's ratings) lose their rows and any word naming them; the run is marked as computed
  before the erasure (erased_participants), its aggregate results left as reported.
- studies_prolificevent: Prolific's webhooks about their submission keep their id and digest (a
  replay is still refused) and lose payload, resource id and result.
- django_admin_log: entries on their rows keep the action and time; object names and change
  messages lose what names them.
- studies_bonuspayment.refused_lines: their Prolific id in a refused payment's lines.
- studies_bonus: a paid bonus stays as the payment record the law asks for (the Prolific
  submission id, the amount, the payment's date), no longer tied to the person.
- studies_review: the approval or rejection sent to Prolific.
- files under the data folder (PARLEY_DATA_DIR), in its participants' folders only
  (places.PERSONAL_FOLDERS: logs/ and *.log, which should hold no identifiers at all,
  parley/server_log.py; exports/ saved there; Celery's file broker and results): redacted in
  place. Models, checkpoints and runs in the same folder are never read or edited.
- Not kept anywhere else: exports are streamed, never cached; the rate limiter counts by a keyed
  hash of the token (studies/participation/ratelimit.py); chat groups are named by internal id.

A paid bonus can be erased; one not yet paid (a payment still being set up or sent) cannot, as
Prolific must still be told whom to pay: ErasureRefused says so, and nothing is changed.
"""

from dataclasses import dataclass

from django.db import transaction

from studies.lib.lock_objects import lock_participant
from studies.models import Bonus, BonusPayment, ErasureRecord, Participant
from studies.privacy.places import PLACES, Person

# Payments in these states still need the participant's Prolific id to be sent.
UNSETTLED = (BonusPayment.State.NEW, BonusPayment.State.SET_UP, BonusPayment.State.PAYING)


class ErasureRefused(ValueError):
    """The erasure cannot be done as asked; nothing was changed."""


@dataclass(frozen=True)
class Plan:
    """The places in the order the erasure empties them: the database's in one transaction,
    the files after it commits (a file cannot be rolled back)."""

    in_database: tuple
    after_commit: tuple


PLAN = Plan(
    in_database=tuple(p for p in PLACES if p.name != "files"),
    after_commit=tuple(p for p in PLACES if p.name == "files"),
)


def erase_participant(participant: Participant, *, reason: str, by: str | None = None):
    """Erase everything parley holds about `participant`; returns the ErasureRecord.

    `reason`: why (required: the audit record must say it). `by`: the staff user's name, or
    the flow that asked (e.g. "withdrawal"). Raises ErasureRefused when the reason is blank or a
    bonus of theirs is not settled yet."""
    reason = (reason or "").strip()
    if not reason:
        raise ErasureRefused("An erasure needs a reason (the request, as received).")
    with transaction.atomic():
        # Locked: a page of theirs writing meanwhile waits, then finds them gone.
        participant = lock_participant(participant.pk)
        unsettled = Bonus.objects.filter(participant=participant, payment__state__in=UNSETTLED)
        if unsettled.exists():
            raise ErasureRefused(
                f"Participant #{participant.pk} has a bonus payment still being set up or sent "
                "to Prolific: let it finish (or fail) first, then erase."
            )
        person = Person(participant)
        number, study_id = participant.pk, participant.study_id
        # The record names the payment rows that stay (they hold the submission id), not the id.
        kept = [
            {
                "bonus": pk,
                "amount": str(amount),
                "paid_at": paid_at.isoformat() if paid_at else None,
            }
            for pk, amount, paid_at in Bonus.objects.filter(participant=participant).values_list(
                "pk", "amount", "payment__paid_at"
            )
        ]
        counts = {place.name: place.erase(person) for place in PLAN.in_database}
        record = ErasureRecord.objects.create(
            erased_by=(by or "")[:150],
            reason=reason,
            study_id=study_id,
            participant_number=number,
            counts=counts,
            kept=kept,
        )
    # The person's identifiers were read before the row went: the files are searched with them.
    files = {place.name: place.erase(person) for place in PLAN.after_commit}
    if files:
        ErasureRecord.objects.filter(pk=record.pk).update(counts={**counts, **files})
        record.counts = {**counts, **files}
    return record


def erase_by_prolific_id(prolific_pid: str, *, reason: str, by: str | None = None) -> list:
    """Every participant with this Prolific id (one per study they took part in) erased; one
    ErasureRecord each. ErasureRefused when there is none (a mistyped id must not look done)."""
    participants = list(Participant.objects.filter(prolific_pid=prolific_pid.strip()))
    if not participants:
        raise ErasureRefused(f"No participant has the Prolific id {prolific_pid.strip()!r}.")
    return [erase_participant(p, reason=reason, by=by) for p in participants]
