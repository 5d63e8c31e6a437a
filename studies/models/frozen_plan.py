"""Pre-registration: the frozen plan and what it freezes."""

import hashlib
import json

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.signals import pre_save
from django.dispatch import receiver

# --- pre-registration (issue 14): the frozen plan and what it freezes ------------------------------

# What a freeze holds fixed, per model: the design of the study and its analysis plan. Arms'
# endpoints and keys are left out (an engine may move host); statuses and texts too.
FROZEN_STUDY_FIELDS = (
    "domain",
    "domain_protocol",
    "target_per_arm",
    "control_arm",
    "comparisons",
    "holm_family",
    "alpha",
    "target_effect",
    "target_power",
    "exclude_failed_attention",
    "exclude_unfinished",
    "lower_is_better",
)
FROZEN_ARM_FIELDS = (
    "name",
    "order",
    "model_name",
    "system_prompt",
    "greeting",
    "temperature",
    "top_p",
    "max_tokens",
    "extra_params",
    "tool_format",
    "tool_choice",
)
FROZEN_ITEM_FIELDS = (
    "key",
    "order",
    "kind",
    "prompt",
    "scale_points",
    "anchor_low",
    "anchor_high",
    "anchor_labels",
    "reverse_coded",
    "min_value",
    "max_value",
    "expected_answer",
)
# The models a plan holds fields of, by label: this module sits below them (Study.clean calls
# frozen_changes), so it names them instead of importing them.
STUDY, ARM, ITEM = "studies.Study", "studies.Arm", "studies.Item"


def frozen_values(instance) -> dict:
    """The frozen fields of a Study, Arm or Item as JSON values (the control arm by name)."""
    if instance._meta.label == STUDY:
        values = {name: getattr(instance, name) for name in FROZEN_STUDY_FIELDS}
        values["control_arm"] = instance.control_arm.name if instance.control_arm_id else None
    else:
        names = FROZEN_ARM_FIELDS if instance._meta.label == ARM else FROZEN_ITEM_FIELDS
        values = {name: getattr(instance, name) for name in names}
    return json.loads(json.dumps(values))  # as stored and read back: 7 and 7.0 compare alike


def _study_of(instance):
    if instance._meta.label == STUDY:
        return instance
    if instance._meta.label == ARM:
        return instance.study if instance.study_id else None
    questionnaire = instance.questionnaire if instance.questionnaire_id else None
    return questionnaire.study if questionnaire else None


def frozen_changes(instance, deleting: bool = False) -> dict[str, str]:
    """What a save (or a delete) of this Study, Arm or Item would change in its study's frozen
    plan, by field, in words; empty when the study is not frozen or nothing frozen changes."""
    if instance._meta.label not in (STUDY, ARM, ITEM):
        return {}  # codes, scenarios and the rest are not part of a plan
    study = _study_of(instance)
    if study is None or not study.pk:
        return {}
    plan = Preregistration.objects.filter(study_id=study.pk).first()
    if plan is None:
        return {}
    why = (
        f"the study's plan was frozen (pre-registered) on {plan.frozen_at:%Y-%m-%d %H:%M} UTC, "
        f"sha256 {plan.sha256[:12]}"
    )
    if instance._meta.label == STUDY:
        before = plan.plan["study"]
    else:
        kind = "arm" if instance._meta.label == ARM else "item"
        section = plan.plan["arms"] if kind == "arm" else plan.plan["items"]
        frozen = {entry["id"]: entry for entry in section}
        if instance.pk not in frozen:
            # A question outside the plan (free text, or added later) is only ever analysed
            # as exploratory; a new arm would take participants the plan does not know.
            return {"__all__": f"Cannot add an arm: {why}."} if kind == "arm" else {}
        if deleting:
            name = frozen[instance.pk]["name" if kind == "arm" else "key"]
            return {"__all__": f"Cannot delete {kind} {name!r}: {why}."}
        before = {k: v for k, v in frozen[instance.pk].items() if k != "id"}
    now = frozen_values(instance)
    return {
        name: f"{name} is frozen at {before[name]!r}: {why}."
        for name in before
        if name in now and now[name] != before[name]
    }


class PlanFrozen(ValidationError):
    """A change the study's pre-registration does not allow."""


@receiver(pre_save, sender=STUDY)
@receiver(pre_save, sender=ARM)
@receiver(pre_save, sender=ITEM)
def refuse_frozen_changes(sender, instance, raw=False, **kwargs):
    """Every path (admin, shell, a checkpoint attached to an arm) meets the freeze, not only
    forms that call clean(). Deletes are refused by the admin's forms (a pre_delete refusal
    would also forbid deleting the whole study); once participants exist, PROTECT keeps their
    arms and answered items."""
    if raw:  # loaddata
        return
    changes = frozen_changes(instance)
    if changes:
        raise PlanFrozen(changes)


class Preregistration(models.Model):
    """A study's plan, frozen before its first participant: the canonical JSON text and its
    SHA-256 (anyone can recompute it from the export), and the plan parsed for the analysis."""

    study = models.OneToOneField(STUDY, on_delete=models.CASCADE, related_name="preregistration")
    plan = models.JSONField(help_text="The frozen plan (studies/research/preregistration.py).")
    # The exact bytes hashed: jsonb reorders keys, so the text is kept as it was hashed.
    canonical = models.TextField(help_text="The plan as canonical JSON, the text hashed.")
    sha256 = models.CharField(max_length=64, help_text="SHA-256 of the canonical text.")
    frozen_at = models.DateTimeField()
    frozen_by = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return f"plan of {self.study.slug} ({self.sha256[:12]})"

    def verify(self) -> bool:
        """True when the stored text still hashes to the stored SHA-256 and is the plan."""
        digest = hashlib.sha256(self.canonical.encode("utf-8")).hexdigest()
        return digest == self.sha256 and json.loads(self.canonical) == self.plan
