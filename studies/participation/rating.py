"""A rater's path through an annotation study: after consent, one conversation at a time, the
study's questions about it (and, when asked, whether the user was a real person), until every
assigned conversation is rated; then the completion code as in any study.

A gold conversation's known answers, and the study's attention items on every conversation, are
the attention checks: a rater who misses one is marked as failing attention (the study's
exclusion rule and its Prolific policy apply).
"""

from django.db import transaction
from django.utils import timezone

from studies.lib.domain_bridge import speaker_names
from studies.lib.flow_errors import FlowError
from studies.lib.lock_objects import lock_participant, lock_rating_assignment
from studies.models import Item, Participant, RatingAssignment
from studies.participation.chat_turn import storable_text
from studies.participation.complete import study_progress
from studies.participation.questionnaire import validate_answers

# The realism item's answers, as stored and analysed: "real" counts toward "judged human".
REALISM = "real_person"
CONFIDENCE = "realism_confidence"
REALISM_CHOICES = (("real", "A real person"), ("simulated", "A computer program"))
CONFIDENCE_POINTS = 5


def current(participant: Participant) -> RatingAssignment | None:
    """The next conversation this rater has not rated, in their order."""
    return (
        participant.rating_assignments.filter(status=RatingAssignment.Status.ASSIGNED)
        .select_related("conversation")
        .order_by("position")
        .first()
    )


def progress(participant: Participant) -> tuple[int, int]:
    """(rated so far, all assigned), for the page's "conversation 2 of 7"."""
    mine = participant.rating_assignments.exclude(status=RatingAssignment.Status.RELEASED)
    return mine.filter(status=RatingAssignment.Status.RATED).count(), mine.count()


def realism_errors(data, user_name: str = "user") -> tuple[dict, dict]:
    answer = (data.get(REALISM) or "").strip()
    confidence = (data.get(CONFIDENCE) or "").strip()
    values, errors = {}, {}
    if answer not in dict(REALISM_CHOICES):
        errors[REALISM] = f"Please say whether you think the {user_name} was a real person."
    else:
        values[REALISM] = answer
    if confidence not in {str(i) for i in range(1, CONFIDENCE_POINTS + 1)}:
        errors[CONFIDENCE] = f"Please choose how sure you are, 1 to {CONFIDENCE_POINTS}."
    else:
        values[CONFIDENCE] = int(confidence)
    return values, errors


@transaction.atomic
def submit(participant: Participant, position, data) -> dict[str, str]:
    """Store one conversation's ratings; errors by field (nothing stored) if any. A repeated
    submit of a rated conversation changes nothing."""
    participant = lock_participant(participant.pk)
    if participant.status != Participant.Status.RATING:
        return {}
    try:
        assignment = lock_rating_assignment(participant, int(storable_text(str(position))))
    except (ValueError, RatingAssignment.DoesNotExist):
        raise FlowError("Unknown conversation", "Please reload the page and rate again.") from None
    if assignment.status != RatingAssignment.Status.ASSIGNED:
        return {}
    study = participant.study
    items = list(study.questionnaire_items())
    values, errors = validate_answers(items, data)
    answers = {item.key: values[item.id] for item in items if item.id in values}
    if study.annotation.ask_realism:
        realism, wrong = realism_errors(data, speaker_names(study.domain)["user"])
        answers |= realism
        errors |= wrong
    if errors:
        return errors
    checks = [i for i in items if i.kind == Item.Kind.ATTENTION]
    gold = {
        **(assignment.conversation.gold or {}),
        **{i.key: float(i.expected_answer) for i in checks},
    }
    if gold:
        missed = any(not same_answer(answers.get(k), v) for k, v in gold.items())
        if missed:
            participant.attention_passed = False
        elif participant.attention_passed is None:
            participant.attention_passed = True
    assignment.answers = answers
    assignment.status = RatingAssignment.Status.RATED
    assignment.rated_at = timezone.now()
    assignment.save(update_fields=["answers", "status", "rated_at"])
    if not participant.rating_assignments.filter(status=RatingAssignment.Status.ASSIGNED).exists():
        participant.status = Participant.Status.COMPLETED
        participant.completed_at = timezone.now()
        transaction.on_commit(lambda: study_progress(participant.study_id))
    participant.save()
    return {}


def same_answer(given, known) -> bool:
    """A gold answer matched: numbers by value (6.0 is 6), anything else as text."""
    try:
        return float(given) == float(known)
    except (TypeError, ValueError):
        return str(given) == str(known)
