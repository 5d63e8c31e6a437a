"""The registry of checkpoints the engines can serve (the only Django-facing part of agents/)."""

import json
from pathlib import Path

from django.db import models

from agents.paths import data_dir


def adapters_dir() -> Path:
    """The folder the embedded engine scans for LoRA adapters (`make demo` points it here)."""
    return data_dir() / "checkpoints"


class Checkpoint(models.Model):
    """A LoRA adapter folder with its manifest.json, served under `name`."""

    name = models.CharField(max_length=200, unique=True, help_text="The model name arms ask for.")
    path = models.CharField(max_length=500)
    base_model = models.CharField(max_length=500, blank=True)
    domain = models.CharField(max_length=20, blank=True)
    regime = models.CharField(max_length=20, blank=True)
    step = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True)
    manifest = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def register(cls, folder: Path) -> "Checkpoint":
        """Record a checkpoint folder and link it where the embedded engine looks for adapters.
        (The run that wrote it is training's to record: agents installs without training.)"""
        folder = Path(folder).resolve()
        manifest = json.loads((folder / "manifest.json").read_text())
        name = manifest.get("name") or folder.name
        link = adapters_dir() / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or not link.exists():
            link.unlink(missing_ok=True)
            link.symlink_to(folder, target_is_directory=True)
        checkpoint, _ = cls.objects.update_or_create(
            name=name,
            defaults=dict(
                path=str(folder),
                base_model=manifest.get("base_model", ""),
                domain=manifest.get("domain", ""),
                regime=manifest.get("regime", ""),
                step=manifest.get("step", 0),
                metrics=manifest.get("metrics", {}),
                manifest=manifest,
            ),
        )
        return checkpoint
