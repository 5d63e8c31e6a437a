"""The questionnaire: every answer checked on the server, stored, and the participant
completed (with the outcome the Domain takes from the answers)."""

from django.db import transaction
from django.utils import timezone

from studies.lib.domain_bridge import outcome_after_questionnaire, questionnaire_inputs
from studies.lib.flow_errors import FlowError
from studies.lib.lock_objects import lock_participant_with_page
from studies.lib.prepared_queries import Prepared
from studies.models import Item, Participant, Response, Study
from studies.participation import problems
from studies.participation.chat_turn import storable_text
from studies.participation.complete import study_progress


def validate_answers(
    items: list[Item], data, needs: dict | None = None
) -> tuple[dict[int, float | str], dict[str, str]]:
    """Check every answer on the server: (values by item id, errors by item key). `needs`: the
    Domain's inputs by name; an item mapped to one must be answered within its bounds."""
    values, errors = {}, {}
    needs = needs or {}
    for item in items:
        need = needs.get(item.domain_input)
        raw = (data.get(item.key) or "").strip()
        if raw != storable_text(raw):  # a NUL or broken character: say so, never a 500
            errors[item.key] = "Please remove the unusual characters from this answer."
            continue
        if not raw:
            if item.required or item.kind == Item.Kind.ATTENTION or need:
                errors[item.key] = "Please answer this question."
            continue
        if item.kind == Item.Kind.TEXT:
            if len(raw) > 5000:
                errors[item.key] = "Please keep this answer under 5000 characters."
            else:
                values[item.id] = raw
            continue
        try:
            number = float(raw)
        except ValueError:
            errors[item.key] = "Please enter a number."
            continue
        if item.is_scale:
            if not number.is_integer() or not 1 <= number <= item.scale_points:
                errors[item.key] = f"Please choose one of the points 1 to {item.scale_points}."
                continue
        else:
            if number != number or number in (float("inf"), float("-inf")):
                errors[item.key] = "Please enter a number."
                continue
            if item.min_value is not None and number < item.min_value:
                errors[item.key] = f"Please enter a number of at least {item.min_value:g}."
                continue
            if item.max_value is not None and number > item.max_value:
                errors[item.key] = f"Please enter a number of at most {item.max_value:g}."
                continue
        if need and not need.min_value <= number <= need.max_value:
            errors[item.key] = (
                f"Please enter a number from {need.min_value:g} to {need.max_value:g}."
            )
            continue
        values[item.id] = number
    return values, errors


ITEMS = Prepared(lambda questionnaire_id: Item.objects.filter(questionnaire_id=questionnaire_id), 1)


def questionnaire_items(study: Study) -> list[Item]:
    """Study.questionnaire_items, through the compiled read (the questionnaire itself comes
    with the participant's page read)."""
    questionnaire = getattr(study, "questionnaire", None)
    return ITEMS.objects(questionnaire.pk) if questionnaire is not None else []


@transaction.atomic
def submit_questionnaire(participant: Participant, data) -> dict[str, str]:
    """Store the answers and complete the participant; returns errors (nothing stored) if any."""
    participant = lock_participant_with_page(participant.pk)
    if participant.status != Participant.Status.QUESTIONNAIRE:
        return {}
    items = questionnaire_items(participant.study)
    needs = questionnaire_inputs(participant)
    values, errors = validate_answers(items, data, needs)
    if errors:
        return errors
    by_id = {item.id: item for item in items}
    # As update_or_create per item, in one read and one insert: under the participant's lock
    # no other request writes these rows meanwhile.
    stored = {r.item_id: r for r in Response.objects.filter(participant=participant)}
    added = []
    for item_id, value in values.items():
        field = "value_text" if isinstance(value, str) else "value_number"
        if item_id in stored:
            setattr(stored[item_id], field, value)
            stored[item_id].save(update_fields=[field])
        else:
            added.append(Response(participant=participant, item_id=item_id, **{field: value}))
    Response.objects.bulk_create(added)
    checks = [item for item in items if item.kind == Item.Kind.ATTENTION]
    if checks:
        participant.attention_passed = all(
            values.get(item.id) == float(item.expected_answer) for item in checks
        )
    inputs = {by_id[i].domain_input: v for i, v in values.items() if by_id[i].domain_input in needs}
    participant.outcome, problem = outcome_after_questionnaire(participant, inputs)
    if problem:  # the participant is done all the same; the researcher sees it on the monitor
        problems.record(
            participant.study,
            participant,
            "questionnaire",
            FlowError("The outcome was not taken from the questionnaire", problem),
        )
    participant.status = Participant.Status.COMPLETED
    participant.completed_at = timezone.now()
    participant.save()
    transaction.on_commit(lambda: study_progress(participant.study_id))
    return {}
