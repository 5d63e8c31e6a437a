"""A training run started from the admin (the only Django-facing part of training/ with tasks.py)."""

from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import models
from django.utils import timezone

from agents.domains import domain_choices
from agents.models import Checkpoint
from training.config import load_config, parse_config
from training.config_keys import ConfigError, key_overlaps
from training.config_schema import RunConfig, regime_choices
from training.vocabulary import Regime

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
# the fields the admin sets over the preset, as RunConfig keys
CONFIG_FIELDS = (
    "name",
    "domain",
    "regime",
    "base_model",
    "steps",
    "group_size",
    "lr",
    "beta",
    "temperature",
)


def preset_choices():
    return [(p.stem, p.stem) for p in sorted(CONFIGS_DIR.glob("*.toml"))]


def preset_config(preset: str) -> RunConfig:
    """A preset as the loader reads it; a ValidationError on `preset` when it cannot be."""
    path = CONFIGS_DIR / f"{preset}.toml"
    if preset not in dict(preset_choices()) or not path.is_file():
        raise ValidationError({"preset": f"No preset {preset!r} in {CONFIGS_DIR}."})
    try:
        return load_config(path)
    except ConfigError as error:
        raise ValidationError({"preset": f"The preset is not valid: {error}"}) from error


def preset_values(preset: str) -> dict:
    """The admin's fields as the preset sets them (a run from it trains these unless changed)."""
    config = preset_config(preset)
    return {key: getattr(config, key) for key in CONFIG_FIELDS}


class TrainingRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        CANCELLING = "cancelling", "Cancelling"
        CANCELLED = "cancelled", "Cancelled"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        # COLLAPSE-AWARE's breaker went red: stopped after a resumable checkpoint (stop_reason)
        STOPPED = "stopped", "Stopped by the breaker"

    name = models.SlugField(max_length=100, unique=True, help_text="Also the output folder's name.")
    preset = models.CharField(
        max_length=100, blank=True, help_text="A config under training/configs to start from."
    )
    domain = models.CharField(max_length=20, choices=domain_choices, default="p4g")
    regime = models.CharField(
        max_length=20,
        choices=regime_choices,
        default=Regime.SINGLE.value,
        help_text="Which simulator the agent meets (the paper's names). Ensemble: its members in"
        ' settings as "ensemble" (a list of simulator tables, K >= 2) and "ensemble_draw"'
        " (rollout | task); the preset's simulator is cleared. Persona-Guided:"
        " \"simulator.guidelines\" in settings (blank: the Domain's, tau2 the paper's text).",
    )
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
    processes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Training processes (data-parallel ranks, started with accelerate launch); "
        "blank: the preset's distributed.processes (1 unless it says).",
    )
    settings = models.JSONField(
        default=dict, blank=True, help_text="Any other RunConfig keys (TOML names)."
    )
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED)
    progress = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    stop_reason = models.TextField(
        blank=True,
        help_text="Why the breaker stopped the run (red: the measures that crossed their"
        " thresholds); resume it to continue with re-diversified simulators.",
    )
    output_dir = models.CharField(max_length=500, blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="When the worker running it last said it was alive."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    checkpoints = models.ManyToManyField(
        Checkpoint, through="RunCheckpoint", related_name="training_runs", blank=True
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def worker_lost(self) -> bool:
        """Running (or cancelling), but its worker has not beaten for PARLEY_TRAINING_LOST_AFTER
        seconds: the worker process died (killed, out of memory, the machine went down), and
        the run will not move until it is resumed."""
        if self.status not in (self.Status.RUNNING, self.Status.CANCELLING):
            return False
        last = self.heartbeat_at or self.started_at
        lost_after = timedelta(seconds=settings.PARLEY_TRAINING_LOST_AFTER)
        return last is not None and timezone.now() - last > lost_after

    def register_checkpoint(self, folder: str | Path) -> Checkpoint:
        """Put a checkpoint folder this run wrote in agents' registry, and link it to the run."""
        checkpoint = Checkpoint.register(Path(folder))
        RunCheckpoint.objects.update_or_create(checkpoint=checkpoint, defaults={"run": self})
        return checkpoint

    def overrides(self) -> dict:
        """What this run changes in its preset: the settings JSON, then the fields set in the
        admin (a plain key replaces the preset's value, as in TOML)."""
        data = dict(self.settings or {})
        for key in CONFIG_FIELDS:
            value = getattr(self, key)
            if value not in (None, ""):
                data[key] = value
        # the simulator kind a regime is made of (Verbalized Sampling's) is the registry's to say;
        # RunConfig refuses any other for it
        kind = next((r.simulator_kind for r in Regime if r == self.regime), None)
        if kind:
            data["simulator.kind"] = kind.value
        settings = self.settings or {}
        if self.regime == Regime.ENSEMBLE and not any(
            key_overlaps("simulator", k) for k in settings
        ):
            # the members play the user: a preset's own simulator would be refused as unread
            data["simulator"] = {}
        if self.processes:
            data["distributed.processes"] = self.processes
        return data

    def config(self) -> RunConfig:
        """The preset read by the same loader as a TOML file on the command line, with this
        run's overrides; a bad value is a ValidationError on the field that set it."""
        try:
            if not self.preset:
                return parse_config({}, self.overrides())
            path = CONFIGS_DIR / f"{self.preset}.toml"
            if not path.is_file():
                raise ValidationError({"preset": f"No preset {self.preset!r} in {CONFIGS_DIR}."})
            return load_config(path, self.overrides())
        except ConfigError as error:
            raise ValidationError(
                {self._field_of(error.key): f"The run's settings are not valid: {error}"}
            ) from error

    def _field_of(self, key: str) -> str:
        """The admin field that set a config key: its own field, the settings JSON, or none."""
        if key.startswith("distributed.processes") and self.processes:
            return "processes"
        top = key.split(".")[0].split("[")[0]
        if top in CONFIG_FIELDS and getattr(self, top) not in (None, ""):
            return top
        if any(key_overlaps(key, setting) for setting in self.settings or {}):
            return "settings"
        return NON_FIELD_ERRORS

    def clean(self):
        if not isinstance(self.settings, dict):
            raise ValidationError({"settings": "Must be a JSON object of RunConfig keys."})
        self.config()


class RunCheckpoint(models.Model):
    """Which run wrote a checkpoint. Training owns the link (agents' Checkpoint knows no runs), so
    agents installs without training; a checkpoint outlives its run."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="checkpoint_links")
    checkpoint = models.OneToOneField(
        Checkpoint, on_delete=models.CASCADE, related_name="training_link"
    )

    def __str__(self) -> str:
        return f"{self.run} -> {self.checkpoint}"
