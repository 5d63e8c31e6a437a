"""Participants' data rights: the audit record an erasure leaves (studies/privacy/erasure.py)."""

from django.db import models

from studies.models.study import Study


class ErasureRecord(models.Model):
    """One person's data erased on request: what kinds, how many rows of each, when, by whom and
    why. It holds none of the data: no Prolific id, token, message or answer, only counts and
    the participant's former internal number (which nothing outside parley knows)."""

    erased_at = models.DateTimeField(auto_now_add=True)
    erased_by = models.CharField(
        max_length=150, blank=True, help_text="The staff user, or the withdrawal that asked."
    )
    reason = models.TextField(help_text="Why: the request as the researcher recorded it.")
    study = models.ForeignKey(
        Study, null=True, blank=True, on_delete=models.SET_NULL, related_name="erasures"
    )
    participant_number = models.PositiveBigIntegerField(
        help_text="The erased participant's internal id (#n on the monitor and in problems)."
    )
    counts = models.JSONField(
        default=dict, help_text="Rows (or files) erased or redacted, by place (studies/privacy)."
    )
    kept = models.JSONField(
        default=list,
        blank=True,
        help_text="What stays by law: each paid bonus (its row keeps the Prolific submission id), "
        "its amount and date.",
    )

    class Meta:
        ordering = ["-erased_at"]
        permissions = [
            ("erase_participant", "Can erase a participant's data on request"),
            ("export_participant", "Can export everything held about a participant"),
        ]

    def __str__(self) -> str:
        return f"erasure of participant #{self.participant_number}"
