"""The consent a participant agreed to: each text a study has shown, kept as a numbered version
with its SHA-256, so an ethics board can be shown exactly what each person agreed to."""

import hashlib

from django.db import models, transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from studies.models.study import Study


def consent_digest(text: str) -> str:
    """SHA-256 of the text as shown (UTF-8): anyone can recompute it from an export."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ConsentVersion(models.Model):
    """One consent text of a study. A version nobody has agreed to yet is edited in place; once
    a participant has agreed to it, it is never changed, and a new text makes a new version."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="consent_versions")
    version = models.PositiveIntegerField()
    text = models.TextField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    # Made by the migration from the study's text at the time (issue 39): participants from
    # before versions were kept may have seen an earlier text.
    reconstructed = models.BooleanField(
        default=False,
        editable=False,
        help_text="Made afterwards from the study's text of that day: participants who agreed "
        "before consent was versioned may have read an earlier text.",
    )

    class Meta:
        ordering = ["study", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["study", "version"], name="one_consent_version_number")
        ]

    def __str__(self) -> str:
        return f"consent v{self.version} ({self.sha256[:12]})"


def current_consent(study: Study, lock: bool = False) -> ConsentVersion:
    """The version of the study's consent text as it stands, made if the text changed since the
    last one. `lock`: hold the latest version's row until the caller's transaction ends, so that
    an edit of the text and a participant's agreement never interleave (the caller is inside a
    transaction)."""
    versions = ConsentVersion.objects.filter(study=study).order_by("-version")
    if lock:
        versions = versions.select_for_update()
    latest = versions.first()
    digest = consent_digest(study.consent_text)
    if latest is not None and latest.sha256 == digest:
        return latest
    if latest is not None and not latest.participants.exists():
        # Nobody has agreed to it: the researcher is still writing it, one version.
        latest.text, latest.sha256, latest.reconstructed = study.consent_text, digest, False
        latest.save(update_fields=["text", "sha256", "reconstructed"])
        return latest
    return ConsentVersion.objects.create(
        study=study,
        version=latest.version + 1 if latest is not None else 1,
        text=study.consent_text,
        sha256=digest,
    )


@receiver(post_save, sender=Study)
def version_consent_text(sender, instance, raw=False, **kwargs):
    """Every save of a study (admin, shell, a copy) keeps its consent text versioned."""
    if raw:  # loaddata: the fixture brings its own versions
        return
    with transaction.atomic():
        current_consent(instance, lock=True)
