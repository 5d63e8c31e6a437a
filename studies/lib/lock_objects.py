"""Every row lock of the studies app, named once (as Saleor's checkout/lock_objects.py).

Each function takes its lock with the very query its call site used to write (same filter, same
`of=`, select_related and order), so moving a lock here changed no SQL. A lock
lasts until the caller's transaction ends: every function here is called inside one.

The order locks are taken in, when one transaction holds more than one (two transactions that
take two rows in opposite orders can deadlock each other; PostgreSQL then kills one):

    participant  ->  study  ->  consent version
    participant  ->  arm;  study  ->  arm(s)
    participant  ->  rating assignment, withdrawal

- restart (participation/start.py): lock_participant, then lock_arm (place_in_least_filled).
- consent (participation/consent._give_consent): lock_participant_with_page, for a rater lock_study (the
  study's lock that annotation.assignment.assign takes again), then the latest consent version
  (current_consent(lock=True)).
- freezing the plan (research/preregistration.freeze): lock_study, then lock_arm_ids.
- a rating (participation/rating.submit): lock_participant, then lock_rating_assignment.
- a withdrawal's decision (participation/withdraw.decide): lock_participant_with_page, then
  lock_withdrawal (and the erasure's lock_participant on the same row, already held).
A participant's conversation is locked alone (a chat turn: lock_chat_conversation,
lock_conversation_id; a tool call: lock_conversation); a step that holds its participant may
write the conversation after it (participant -> conversation), never the other way round.
The bonus payment (prolific/sync.set_up), the arms of an endpoint edit (setup/arm_endpoints)
and the participants of a retention purge (research/retention.purge) are each locked alone.
Saving a study in the admin holds the study's row, then versions its consent text
(models/consent.py's post_save: study -> consent version); a rater's consent takes them in the
same order (it took the consent version first until a deadlock was reproduced: an edit of an
annotation study's consent text at the moment a rater agreed lost the researcher's save).

Two locks live below this module, in the data layer it may not be imported by
(pyproject.toml's layers): the sweep of overdue participants (studies/models/participant.py,
time_out_overdue: SKIP LOCKED, so it never waits on a step) and the latest consent version
(studies/models/consent.py, current_consent). tests/studies/lib/test_lock_objects.py fails on
any other `select_for_update` outside this module.
"""

from django.db.models import QuerySet

from studies.lib.prepared_queries import Prepared
from studies.models import (
    Arm,
    BonusPayment,
    Conversation,
    Participant,
    RatingAssignment,
    Study,
    Withdrawal,
)

# What a participant's pages show besides the participant: study__annotation tells an
# annotation study, study__questionnaire the questionnaire's page, without another read. The
# flow's steps read them under the lock (lock_participant_with_page), so that a step reads no
# study, arm or scenario again; participation/arrive.py reads them with a page's participant.
PAGE_RELATIONS = ("study", "study__annotation", "study__questionnaire", "arm", "scenario")


# --- participant -------------------------------------------------------------------------------


def lock_participant(pk: int) -> Participant:
    """The participant's row alone, locked; DoesNotExist as `get`."""
    return Participant.objects.select_for_update().get(pk=pk)


# Of its own row only, with the page's relations (compiled once: studies/lib/prepared_queries.py).
LOCKED_PARTICIPANT = Prepared(
    lambda pk: (
        Participant.objects.select_for_update(of=("self",))
        .select_related(*PAGE_RELATIONS)
        .filter(pk=pk)
    ),
    1,
)


def lock_participant_with_page(pk: int) -> Participant:
    """The participant, locked (its row only), with PAGE_RELATIONS read; DoesNotExist as `get`."""
    found = LOCKED_PARTICIPANT.objects(pk)
    if not found:
        raise Participant.DoesNotExist("Participant matching query does not exist.")
    return found[0]


def lock_participants(participants: QuerySet) -> QuerySet:
    """These participants' rows (their own rows only, not the joined ones), locked when the
    queryset is read."""
    return participants.select_for_update(of=("self",))


# --- study and arms ----------------------------------------------------------------------------


def lock_study(pk: int) -> Study:
    """The study's row, locked."""
    return Study.objects.select_for_update().get(pk=pk)


def lock_arm(pk: int) -> None:
    """The arm's row, locked, reading only its id (an arrival's place is counted under it)."""
    # Unordered: Arm's default order joins the study, and FOR UPDATE would lock its row too.
    list(Arm.objects.select_for_update().filter(pk=pk).order_by().values_list("pk"))


def lock_arm_ids(study: Study) -> None:
    """Every arm of the study, locked, reading only their ids. In Arm's default order, which
    joins the study: its row is locked too (take lock_study first)."""
    list(Arm.objects.select_for_update().filter(study=study).values_list("pk"))


def lock_arms(study: Study) -> list[Arm]:
    """The study's arms, locked, in their order."""
    return list(study.arms.select_for_update().order_by("order", "id"))


# --- a participant's conversation --------------------------------------------------------------

# The participant's conversation (its row only), with what of the participant changes during a
# chat (status, clock): a chat turn's one read under its lock.
LOCK_CHAT = Prepared(
    lambda participant: (
        Conversation.objects.select_for_update(of=("self",))
        .filter(participant=participant)
        .values_list("pk", "ended_at", "participant__status", "participant__created_at")
    ),
    1,
)

# The conversation's row, reading only its id (the agent's turn orders two windows' writes).
LOCK_CONVERSATION = Prepared(
    lambda pk: Conversation.objects.select_for_update().filter(pk=pk).values_list("pk"), 1
)


def lock_chat_conversation(participant_pk: int) -> list[tuple]:
    """[(conversation id, ended_at, participant status, participant created_at)] of the
    participant's conversation, locked; [] when they have none."""
    return LOCK_CHAT.rows(participant_pk)


def lock_conversation_id(pk: int) -> list[tuple[int]]:
    """The conversation's row, locked, reading only its id: [(pk,)], or [] when gone."""
    return LOCK_CONVERSATION.rows(pk)


def lock_conversation(pk: int) -> Conversation:
    """The conversation, locked (a tool call changes its state)."""
    return Conversation.objects.select_for_update().get(pk=pk)


# --- the participant's own rows ----------------------------------------------------------------


def lock_rating_assignment(participant: Participant, position: int) -> RatingAssignment:
    """The rater's assignment at `position`, locked; DoesNotExist as `get`."""
    return participant.rating_assignments.select_for_update().get(position=position)


def lock_withdrawal(participant: Participant) -> Withdrawal:
    """The participant's withdrawal, locked."""
    return Withdrawal.objects.select_for_update().get(participant=participant)


# --- Prolific ----------------------------------------------------------------------------------


def lock_bonus_payment(pk: int) -> BonusPayment:
    """The bonus payment, locked, with its study."""
    return BonusPayment.objects.select_for_update().select_related("study").get(pk=pk)
