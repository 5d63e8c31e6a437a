"""A training run started from the admin (the only Django-facing part of training/ with tasks.py)."""

import tomllib
from pathlib import Path

from django.core.exceptions import ValidationError
from django.db import models

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
DOMAINS = [("p4g", "Persuasion for Good"), ("retail", "tau2 retail"), ("airline", "tau2 airline")]
REGIMES = [
    ("single", "Single simulator"),
    ("verbalized", "Verbalized Sampling"),
    ("cotrain", "Co-Training"),
    ("population", "Population Co-Training"),
]


def preset_choices():
    return [(p.stem, p.stem) for p in sorted(CONFIGS_DIR.glob("*.toml"))]


class TrainingRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        CANCELLING = "cancelling", "Cancelling"
        CANCELLED = "cancelled", "Cancelled"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    name = models.SlugField(max_length=100, unique=True, help_text="Also the output folder's name.")
    preset = models.CharField(
        max_length=100, blank=True, help_text="A config under training/configs to start from."
    )
    domain = models.CharField(max_length=20, choices=DOMAINS, default="p4g")
    regime = models.CharField(max_length=20, choices=REGIMES, default="single")
    base_model = models.CharField(
        max_length=500, blank=True, help_text="Model folder; blank: SmolLM2 base."
    )
    steps = models.PositiveIntegerField(null=True, blank=True, help_text="Blank: the preset's.")
    group_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="G rollouts per task."
    )
    lr = models.FloatField(null=True, blank=True)
    beta = models.FloatField(null=True, blank=True, help_text="KL weight (0: no reference model).")
    temperature = models.FloatField(null=True, blank=True)
    settings = models.JSONField(
        default=dict, blank=True, help_text="Any other RunConfig keys (TOML names)."
    )
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED)
    progress = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    output_dir = models.CharField(max_length=500, blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def config_dict(self) -> dict:
        """The preset's TOML, then the settings JSON, then the fields set in the admin."""
        data: dict = {}
        if self.preset:
            path = CONFIGS_DIR / f"{self.preset}.toml"
            if not path.is_file():
                raise ValidationError({"preset": f"No preset {self.preset!r} in {CONFIGS_DIR}."})
            data = tomllib.loads(path.read_text())
        data.update(self.settings or {})
        data.update(name=self.name, domain=self.domain, regime=self.regime)
        for key in ("base_model", "steps", "group_size", "lr", "beta", "temperature"):
            value = getattr(self, key)
            if value not in (None, ""):
                data[key] = value
        if self.regime == "verbalized":
            data.setdefault("simulator", {})["kind"] = "verbalized"
        return data

    def config(self):
        from training.config import ConfigError, RunConfig

        try:
            return RunConfig.from_dict(self.config_dict()).validate()
        except ConfigError as error:
            raise ValidationError(f"The run's settings are not valid: {error}") from error

    def clean(self):
        if not isinstance(self.settings, dict):
            raise ValidationError({"settings": "Must be a JSON object of RunConfig keys."})
        self.config()
