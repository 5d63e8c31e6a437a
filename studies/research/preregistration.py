"""Pre-registration: a study's plan frozen before its first participant.

The plan is the design and the confirmatory analysis as they stand at the freeze: arms,
measures (direction, reverse coding), comparisons, Holm family, alpha, exclusion rules,
target N and its power analysis, and the exact analysis Settings. It is stored as canonical
JSON with its SHA-256 (studies.analysis.plan); afterwards models refuse changes to what it
holds (studies.models.frozen_changes) and the confirmatory analysis reads only the plan.
"""

from django.db import transaction
from django.utils import timezone

from studies.analysis import plan as canonical_plan
from studies.lib.lock_objects import lock_arm_ids, lock_study
from studies.models import (
    PLANNED_ITEM_KINDS,
    Participant,
    Preregistration,
    Study,
    current_consent,
    frozen_values,
    only_people,
)
from studies.research.analysis_runs import OUTCOME, plan_document, planned_settings, study_power

FORMAT = "parley.preregistration/1"


class FreezeRefused(Exception):
    """The study cannot be frozen now; the message says why."""


def first_participants(study: Study):
    """People who took part (previews and bots are not participants of the study)."""
    return Participant.objects.filter(only_people(), study=study)


def consent_of(study: Study) -> dict:
    """The study's consent version as it stands: number and SHA-256 of its text."""
    version = current_consent(study)
    return {"version": version.version, "sha256": version.sha256}


def plan_of(study: Study) -> dict:
    """The plan as it would be frozen now (JSON values only)."""
    settings = planned_settings(study)
    items = [i for i in study.questionnaire_items() if i.kind in PLANNED_ITEM_KINDS]
    lower = set(settings.lower_better)
    measures = [
        {
            "key": item.key,
            "kind": item.kind,
            "scale_points": item.scale_points if item.kind == item.Kind.LIKERT else None,
            "range": [item.min_value, item.max_value] if item.kind == item.Kind.NUMBER else None,
            "reverse_coded": item.reverse_coded,
            "better": "lower" if item.key in lower else "higher",
        }
        for item in items
        if item.key in settings.measures
    ]
    if OUTCOME in settings.measures:
        bounds = (settings.ranges or {}).get(OUTCOME)
        measures.append(
            {
                "key": OUTCOME,
                "kind": "outcome",
                "scale_points": None,
                "range": list(bounds) if bounds else None,
                "reverse_coded": False,
                "better": "lower" if OUTCOME in lower else "higher",
            }
        )
    found = study_power(study)
    values = {
        "format": FORMAT,
        "study": {"slug": study.slug, "title": study.title, **frozen_values(study)},
        "arms": [
            {"id": arm.pk, **frozen_values(arm)} for arm in study.arms.order_by("order", "id")
        ],
        "items": [{"id": item.pk, **frozen_values(item)} for item in items],
        "measures": measures,
        "comparisons": settings.pairs,
        "control_arm": settings.control,
        "family": {"holm": settings.family, "size": found.family if found else None},
        "alpha": study.alpha,
        "exclusions": {
            "failed_attention_check": settings.exclude_failed_attention,
            "unfinished": settings.exclude_unfinished,
            "attention_checks": [i.key for i in items if i.kind == i.Kind.ATTENTION],
            "always": "previews, bot participants, declined consent, could not start",
        },
        "target_per_arm": study.target_per_arm,
        # The consent text participants will agree to (a later text is a new version, and
        # each participant's record names theirs; exports list them).
        "consent": consent_of(study),
        "power": found.to_dict() if found else None,
        "analysis": canonical_plan.settings_values(settings),
    }
    return values


def freeze(study: Study, by: str = "") -> Preregistration:
    """Freeze the study's plan, once, before its first participant; FreezeRefused otherwise.

    The study's arms are locked as participant arrival locks them (studies.participation.assign), so nobody
    arrives between the check and the freeze.
    """
    with transaction.atomic():
        locked = lock_study(study.pk)
        lock_arm_ids(locked)
        if Preregistration.objects.filter(study=locked).exists():
            raise FreezeRefused(f"{locked} is already pre-registered; a plan is frozen once.")
        if first_participants(locked).exists():
            raise FreezeRefused(
                f"{locked} already has participants: a plan is frozen before the first one "
                "arrives (previews and bot rehearsals do not count)."
            )
        problems = planned_settings(locked).problems()
        if not locked.arms.exists():
            problems.append("there are no arms")
        if problems:
            raise FreezeRefused(f"{locked} cannot be frozen yet: {'; '.join(problems)}.")
        values = plan_of(locked)
        text = canonical_plan.canonical(values)
        return Preregistration.objects.create(
            study=locked,
            plan=values,
            canonical=text,
            sha256=canonical_plan.digest(text),
            frozen_at=timezone.now(),
            frozen_by=by,
        )


def document(study: Study) -> dict | None:
    """The study's pre-registration as exported, or None when it has none."""
    frozen = study.preregistered()
    return plan_document(frozen) if frozen is not None else None
