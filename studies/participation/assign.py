"""Assignment: the arm and scenario of a new place, the least filled and least used, under the
arm's lock and its cap."""

from django.db import transaction
from django.db.models import Count, Q

from studies.lib.flow_errors import FlowError, StudyFull
from studies.lib.lock_objects import lock_arm
from studies.lib.prepared_queries import Prepared
from studies.models import Arm, Participant, Scenario, Study

ASSIGN_ATTEMPTS = 8  # choices of an arm before an arrival takes the one it holds


class ArmTaken(Exception):
    """Another arrival filled the chosen arm meanwhile: choose again."""


@transaction.atomic
def join_least_filled(study: Study, values: dict[str, str], is_bot: bool, last: bool):
    arm, scenario = place_in_least_filled(study, is_bot, last)
    return Participant.objects.create(
        study=study,
        arm=arm,
        scenario=scenario,
        prolific_pid=values["PROLIFIC_PID"],
        prolific_study_id=values["STUDY_ID"],
        prolific_session_id=values["SESSION_ID"],
        is_bot=is_bot,
    )


def place_in_least_filled(study: Study, is_bot: bool, last: bool) -> tuple[Arm, Scenario | None]:
    """The arm (locked until the caller's transaction ends) and scenario of a new place.

    Under the arm's lock its count is exact, so the target per arm is a cap two concurrent
    arrivals cannot both pass: an arm found full sends the arrival to choose again, and when
    every arm is full it takes no place (StudyFull). Bots rehearse beside people, uncapped.
    """
    arm = least_filled_arm(study, is_bot)
    lock_arm(arm.pk)
    filled = {a.pk: a.filled for a in arms_with_fill(study, is_bot)}
    mine = filled.get(arm.pk, arm.filled)
    if not is_bot and mine >= study.target_per_arm:
        if min(filled.values(), default=mine) >= study.target_per_arm or last:
            raise StudyFull()
        raise ArmTaken
    if mine > min(filled.values(), default=0) and not last:
        raise ArmTaken
    return arm, scenario_for(study, arm, is_bot)


def scenario_for(study: Study, arm: Arm, is_bot: bool = False) -> Scenario | None:
    """The least-used scenario; a study whose Domain needs one and has none starts nobody (the
    participant is told, and takes no place)."""
    scenario = least_used_scenario(study, arm, is_bot)
    if scenario is None and study.needs_scenarios():
        raise FlowError(
            "This study is not ready",
            "The study has no task ready for you yet. Please try again later or return to "
            "Prolific.",
            503,
        )
    return scenario


def is_full(study: Study) -> bool:
    """Every active arm holds its target of people (active plus completed)."""
    arms = arms_with_fill(study)
    return bool(arms) and all(arm.filled >= study.target_per_arm for arm in arms)


def _arms_with_fill(is_bot: bool) -> Prepared:
    holding = Q(
        participants__status__in=Participant.ACTIVE,
        participants__is_bot=is_bot,
        participants__is_preview=False,
    )
    return Prepared(
        lambda study_id: (
            Arm.objects.filter(study_id=study_id, active=True)
            .order_by()
            .annotate(filled=Count("participants", filter=holding))
        ),
        1,
    )


# compiled once (studies/lib/prepared_queries.py): each arrival counts twice, and compiling the
# annotated query cost more than running it
ARMS_WITH_FILL = {is_bot: _arms_with_fill(is_bot) for is_bot in (False, True)}


def arms_with_fill(study: Study, is_bot: bool = False) -> list[Arm]:
    """The active arms, each with `filled`: its active plus completed participants (bots
    counted apart from people; previews never)."""
    return ARMS_WITH_FILL[bool(is_bot)].objects(study.pk)


def least_filled_arm(study: Study, is_bot: bool = False) -> Arm:
    """Fewest active plus completed participants; ties go to the lower (order, id). Bots are
    balanced among bots, so a rehearsal never tilts where real participants go."""
    arms = arms_with_fill(study, is_bot)
    if not arms:
        raise FlowError("This study is not ready", "The study has no active arm yet.", 503)
    return min(arms, key=lambda arm: (arm.filled, arm.order, arm.id))


def _scenario_use(is_bot: bool) -> Prepared:
    return Prepared(
        lambda study_id, arm_id: (
            Scenario.objects.filter(study_id=study_id, active=True)
            .order_by()
            .annotate(
                used=Count(
                    "participants",
                    filter=Q(
                        participants__arm_id=arm_id,
                        participants__status__in=Participant.ACTIVE,
                        participants__is_bot=is_bot,
                        participants__is_preview=False,
                    ),
                )
            )
        ),
        2,
    )


SCENARIO_USE = {is_bot: _scenario_use(is_bot) for is_bot in (False, True)}


def least_used_scenario(study: Study, arm: Arm, is_bot: bool = False) -> Scenario | None:
    """Within the arm, the scenario used least often, so every scenario is used about equally."""
    scenarios = SCENARIO_USE[bool(is_bot)].objects(study.pk, arm.pk)
    return min(scenarios, key=lambda s: (s.used, s.id), default=None)
