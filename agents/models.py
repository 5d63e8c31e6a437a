"""The registries of agents/ (its only Django-facing part): the checkpoints the engines can
serve, and the model endpoints that serve them (replicas, and their health as last probed)."""

import json
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.utils import timezone

from agents.llm.health import Probe, probe_all
from agents.paths import adapters_dir, secret
from agents.serving.adapters import MANIFEST

__all__ = ["Checkpoint", "ModelEndpoint", "Replica", "adapters_dir"]


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
        manifest = json.loads((folder / MANIFEST).read_text())
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


ENV_NAME = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "The NAME of an environment variable (letters, digits, _)."
)
DEFAULT_ENDPOINT = "default"  # the endpoint of PARLEY_ENGINE_URL, made when an arm needs it


def check_interval() -> float:
    """PARLEY_ENDPOINT_CHECK_INTERVAL: seconds between beat's health checks of the replicas."""
    return settings.PARLEY_ENDPOINT_CHECK_INTERVAL


class ModelEndpoint(models.Model):
    """An OpenAI-compatible service under one name: one or more replicas serving the same
    models. Arms point here; a conversation sticks to one replica (agents.llm.replicas)."""

    class Kind(models.TextChoices):
        VLLM = "vllm", "vLLM"
        EMBEDDED = "embedded", "Embedded engine"
        HOSTED = "hosted", "Hosted API"

    class Health(models.TextChoices):  # the whole endpoint's, from its replicas' status
        GREEN = "green", "every replica up"
        AMBER = "amber", "some replicas up, or not checked yet"
        RED = "red", "no replica up"

    name = models.CharField(
        max_length=100, unique=True, help_text="How arms and `serve_agents` refer to it."
    )
    kind = models.CharField(
        max_length=10,
        choices=Kind.choices,
        default=Kind.VLLM,
        help_text="Hosted APIs are not asked for GET /health, only for their model list.",
    )
    api_key_env = models.CharField(
        max_length=100,
        blank=True,
        validators=[ENV_NAME],
        help_text="NAME of the environment variable holding the API key (never the key "
        "itself); blank: the servers need none.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model endpoint"

    def __str__(self) -> str:
        return self.name

    def api_key(self) -> str | None:
        return secret(self.api_key_env) if self.api_key_env else None

    def replica_list(self) -> list["Replica"]:
        """The replicas in order (prefetched ones are used as they are: no query)."""
        return sorted(self.replicas.all(), key=lambda r: (r.position, r.pk or 0))

    def urls(self) -> list[str]:
        return [replica.url for replica in self.replica_list()]

    def routing(self) -> tuple[tuple[str, ...], frozenset[str]]:
        """(the replica URLs, those the last check found down), worked out once per loaded
        endpoint: a chat turn asks for them every time (agents.llm.replicas picks from them)."""
        routing = self.__dict__.get("_routing")
        if routing is None:
            replicas = self.replica_list()
            routing = self.__dict__["_routing"] = (
                tuple(r.url for r in replicas),
                frozenset(r.url for r in replicas if r.status == Replica.Status.DOWN),
            )
        return routing

    def health(self) -> str:
        statuses = [replica.status for replica in self.replica_list()]
        up = statuses.count(Replica.Status.UP)
        if statuses and up == len(statuses):
            return self.Health.GREEN
        if up or Replica.Status.UNKNOWN in statuses:
            return self.Health.AMBER
        return self.Health.RED

    def served_models(self) -> list[str]:
        """Every model some replica that is up serves, as last checked."""
        return sorted(
            {
                name
                for replica in self.replica_list()
                if replica.status == Replica.Status.UP
                for name in replica.served_models
            }
        )

    def is_stale(self) -> bool:
        """Some replica was never checked, or not within the check interval."""
        since = timezone.now() - timedelta(seconds=check_interval())
        return any(r.checked_at is None or r.checked_at < since for r in self.replica_list())

    def model_problem(self, model: str, refresh: bool = True) -> str | None:
        """Why `model` cannot be served here, in words (None: some healthy replica serves it).
        `refresh`: check the replicas first if the stored results are stale or do not show
        the model (an adapter may have been loaded since)."""
        if refresh and (self.is_stale() or model not in self.served_models()):
            self.refresh_health()
        if model in self.served_models():
            return None
        if not any(r.status == Replica.Status.UP for r in self.replica_list()):
            errors = "; ".join(
                f"{r.url}: {r.last_error or r.get_status_display()}" for r in self.replica_list()
            )
            return f"no replica of endpoint {self.name} is up ({errors or 'it has no replica'})"
        served = ", ".join(self.served_models()) or "nothing"
        return f"endpoint {self.name} does not serve {model} (its healthy replicas serve: {served})"

    def refresh_health(self) -> "ModelEndpoint":
        """Probe every replica now (all at once) and store what each answered."""
        replicas = self.replica_list()
        if self.api_key_env and self.api_key() is None:
            unset = f"the environment variable {self.api_key_env} is unset"
            probes = [Probe(r.url, False, error=unset) for r in replicas]
        else:
            probes = async_to_sync(probe_all)(
                [r.url for r in replicas], self.api_key(), health=self.kind != self.Kind.HOSTED
            )
        now = timezone.now()
        with transaction.atomic():
            for replica, probe in zip(replicas, probes, strict=True):
                replica.record(probe, now)
        self.__dict__.pop("_routing", None)
        return self

    @classmethod
    @transaction.atomic
    def register(
        cls, name: str, kind: str, urls: list[str], api_key_env: str = "", keep_stored=False
    ):
        """Create or update the endpoint `name` with exactly these replica URLs, in this order;
        a URL it already had keeps its stored health. `keep_stored`: the replicas it already
        had stay too, after these (one added in the admin outlives a restart of the engine)."""
        if kind not in cls.Kind.values:
            raise ValidationError(f"kind must be one of {cls.Kind.values}, not {kind!r}")
        urls = [url.rstrip("/") for url in urls]
        if not urls or len(set(urls)) != len(urls):
            raise ValidationError(f"An endpoint needs one or more distinct replica URLs: {urls}")
        endpoint, _ = cls.objects.select_for_update().update_or_create(
            name=name, defaults={"kind": kind, "api_key_env": api_key_env}
        )
        endpoint.full_clean()
        if keep_stored:
            stored = endpoint.replicas.order_by("position", "id").values_list("url", flat=True)
            urls += [url for url in stored if url not in urls]
        endpoint.replicas.exclude(url__in=urls).delete()
        for position, url in enumerate(urls):
            replica, _ = Replica.objects.update_or_create(
                endpoint=endpoint, url=url, defaults={"position": position}
            )
            replica.full_clean()
        return cls.objects.prefetch_related("replicas").get(pk=endpoint.pk)

    @classmethod
    def default(cls) -> "ModelEndpoint":
        """The endpoint of PARLEY_ENGINE_URL, where new arms point unless told otherwise."""
        return cls.of_url(settings.PARLEY_ENGINE_URL)

    @classmethod
    def of_url(cls, url: str, kind: str = Kind.EMBEDDED) -> "ModelEndpoint":
        """The endpoint with a replica at `url`, else one made now with that one replica (named
        `default` for PARLEY_ENGINE_URL, else after the URL's host and port)."""
        url = url.rstrip("/")
        replica = Replica.objects.filter(url=url).order_by("endpoint_id").first()
        if replica is not None:
            return replica.endpoint
        netloc = urlsplit(url).netloc or url[:80]
        name = DEFAULT_ENDPOINT if url == settings.PARLEY_ENGINE_URL.rstrip("/") else netloc
        if cls.objects.filter(name=name).exists():  # someone else's: leave it be
            name = f"{name} {netloc}" if name == DEFAULT_ENDPOINT else f"{name} {url}"
        return cls.register(name, kind, [url])


class Replica(models.Model):
    """One server of an endpoint, with what it answered when last probed."""

    class Status(models.TextChoices):
        UNKNOWN = "unknown", "Not checked yet"
        UP = "up", "Up"
        DOWN = "down", "Down"

    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.CASCADE, related_name="replicas")
    url = models.URLField(
        max_length=500, help_text="OpenAI-compatible base URL, e.g. http://host:8001/v1"
    )
    position = models.PositiveSmallIntegerField(default=0, help_text="Order among the replicas.")
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.UNKNOWN, editable=False
    )
    served_models = models.JSONField(
        default=list, blank=True, editable=False, help_text="GET /v1/models, when last up."
    )
    last_error = models.TextField(blank=True, editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    checked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["endpoint", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "url"], name="unique_replica_url")
        ]

    def __str__(self) -> str:
        return self.url

    def save(self, *args, **kwargs):
        self.url = self.url.rstrip("/")
        super().save(*args, **kwargs)

    def record(self, probe: Probe, now) -> None:
        """Store one probe's answer; the last error stays (with its time) once the replica is
        up again, so a flapping replica can be seen."""
        self.status = self.Status.UP if probe.up else self.Status.DOWN
        self.checked_at = now
        fields = ["status", "checked_at"]
        if probe.up:
            self.served_models = probe.models
            fields.append("served_models")
        else:
            self.last_error, self.last_error_at = probe.error[:2000], now
            fields += ["last_error", "last_error_at"]
        self.save(update_fields=fields)
