"""A study is data: arms, a scenario pool and a questionnaire, configured in the admin."""

import hashlib
import json
import secrets
import uuid
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models, transaction
from django.db.models.signals import pre_save
from django.dispatch import receiver
from django.utils import timezone

from agents.domains import STUDY_DOMAINS, QuestionnaireInput, domain_class, input_choices
from agents.domains import domain_choices as registered_domains
from agents.models import Checkpoint, ModelEndpoint

COMPLETE_URL = "https://app.prolific.com/submissions/complete?cc={code}"


def domain_choices() -> list[tuple[str, str]]:
    """Open chat, then every Domain people can take part in, from the one registry."""
    return [(Study.OPEN_CHAT, "Open chat (no task)"), *registered_domains(STUDY_DOMAINS)]


def domain_input_choices() -> list[tuple[str, str]]:
    """Every answer a study's Domain may read from its questionnaire, from the one registry."""
    return input_choices(STUDY_DOMAINS)


def default_engine_url() -> str:  # the default of a field migration 0001 still makes
    return settings.PARLEY_ENGINE_URL


def new_bot_key() -> str:
    """A study's key for signing its bot participants (studies/rehearsal/bots.py)."""
    return secrets.token_urlsafe(32)


def arm_model_check() -> str:
    """PARLEY_ARM_MODEL_CHECK: "refuse" (default) or "warn", when an arm is pointed at a model
    that no healthy replica of its endpoint serves."""
    return settings.PARLEY_ARM_MODEL_CHECK


class Study(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        LIVE = "live", "Live"
        PAUSED = "paused", "Paused"
        CLOSED = "closed", "Closed"

    class Comparisons(models.TextChoices):
        CONTROL = "control", "Every arm against the control arm"
        ALL = "all", "All pairs of arms"

    class Family(models.TextChoices):
        MEASURE = "measure", "One measure"
        STUDY = "study", "The whole study"

    class Feedback(models.TextChoices):
        NOTHING = "nothing", "Nothing"
        WORDS = "words", "The outcome in words"
        SCORE = "score", "The outcome in words and the score"

    OPEN_CHAT = "chat"  # the `domain` of a study with no task: free conversation

    slug = models.SlugField(unique=True, help_text="Part of the participant link: /s/SLUG/")
    title = models.CharField(max_length=200)
    domain = models.CharField(max_length=20, choices=domain_choices, default=OPEN_CHAT)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    target_per_arm = models.PositiveIntegerField(default=20, validators=[MinValueValidator(1)])
    prolific_study_id = models.CharField(
        max_length=64, blank=True, help_text="If set, links whose STUDY_ID differs are refused."
    )
    consent_text = models.TextField(
        default="You are invited to take part in a short research study."
    )
    instructions = models.TextField(blank=True, help_text="Shown beside the chat.")
    debrief_text = models.TextField(default="Thank you for taking part.")
    outcome_feedback = models.CharField(
        "tell participants",
        max_length=10,
        choices=Feedback.choices,
        default=Feedback.NOTHING,
        help_text="What the debrief says about how each participant's task went. A decision "
        "they made in the task (a P4G donation) is always confirmed.",
    )
    close_when_full = models.BooleanField(
        default=False,
        help_text="Close the study by itself once every active arm has its target of completed "
        "participants.",
    )
    estimated_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Prolific's estimated completion time (filled by the sync): under 5 minutes, one "
        "failed attention check allows a rejection, else two.",
    )
    time_limit_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    # Prolific's own unit: pence (GBP) or cents (USD) per participant; checked against Prolific's
    # hourly rates at the median completion time (studies.analysis.pay).
    reward = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="What each participant is paid on Prolific, in pence or cents (150 = 1.50).",
    )
    reward_currency = models.CharField(
        max_length=3, choices=[("GBP", "GBP (pence)"), ("USD", "USD (cents)")], default="GBP"
    )
    min_exchanges = models.PositiveIntegerField(
        default=1, help_text="Messages the participant sends before they may end the chat."
    )
    max_exchanges = models.PositiveIntegerField(
        default=20, validators=[MinValueValidator(1)], help_text="The chat ends after this many."
    )
    max_message_chars = models.PositiveIntegerField(default=2000, validators=[MinValueValidator(1)])
    control_arm = models.ForeignKey(
        "Arm", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    comparisons = models.CharField(max_length=10, choices=Comparisons.choices, default="control")
    holm_family = models.CharField(max_length=10, choices=Family.choices, default="measure")
    # --- planning and pre-registration (issue 14): frozen with the plan (Preregistration) ---
    alpha = models.FloatField(
        default=0.05,
        help_text="Significance level of the confirmatory tests, before Holm's correction.",
    )
    target_effect = models.FloatField(
        "target effect (Hedges' g)",
        default=0.5,
        help_text="The smallest effect the study is planned to detect; the power analysis "
        "gives the participants per arm it needs.",
    )
    target_power = models.FloatField(
        default=0.8, help_text="Chance of detecting the target effect at Holm's first step."
    )
    exclude_failed_attention = models.BooleanField(
        default=True,
        help_text="Leave participants who failed an attention check out of the analysis.",
    )
    exclude_unfinished = models.BooleanField(
        default=True, help_text="Leave participants who did not complete out of the analysis."
    )
    lower_is_better = models.CharField(
        max_length=500,
        blank=True,
        help_text="Measure keys, comma-separated, where a lower value is the better outcome "
        "(after reverse coding); every other measure: higher is better.",
    )
    # Signs this study's bot participants. In the database, the one thing every process of the
    # site shares: a bot is a bot to every web worker whatever each process's SECRET_KEY.
    bot_key = models.CharField(max_length=64, default=new_bot_key, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "studies"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.title

    def clean(self):
        if self.min_exchanges > self.max_exchanges:
            raise ValidationError({"min_exchanges": "Must not exceed max_exchanges."})
        if (
            self.prolific_study_id
            and Study.objects.filter(prolific_study_id=self.prolific_study_id)
            .exclude(pk=self.pk)
            .exists()
        ):
            raise ValidationError({"prolific_study_id": "Another study is linked to it."})
        if self.control_arm_id and self.pk and self.control_arm.study_id != self.pk:
            raise ValidationError({"control_arm": "The control arm must belong to this study."})
        errors = {}
        for name in ("alpha", "target_power"):
            if not 0 < getattr(self, name) < 1:
                errors[name] = "Must lie strictly between 0 and 1."
        if not self.target_effect > 0:
            errors["target_effect"] = "Hedges' g to detect must be above 0."
        if self.pk and hasattr(self, "questionnaire"):
            known = {i.key for i in self.questionnaire_items()} | {"outcome"}
            unknown = [k for k in self.lower_better_measures() if k not in known]
            if unknown:
                errors["lower_is_better"] = (
                    f"Not measures of this study: {', '.join(unknown)} "
                    f"(measures: {', '.join(sorted(known))})."
                )
        errors |= frozen_changes(self)
        if errors:
            raise ValidationError(errors)

    def lower_better_measures(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.lower_is_better.split(",") if k.strip())

    def preregistered(self) -> "Preregistration | None":
        """The frozen plan, or None when the study is not pre-registered."""
        try:
            return self.preregistration
        except Preregistration.DoesNotExist:
            return None

    def domain_inputs(self) -> tuple[QuestionnaireInput, ...]:
        """What the study's Domain reads from the questionnaire (none for open chat, or for a
        domain no longer registered: the go-live checks name that)."""
        if self.domain == self.OPEN_CHAT:
            return ()
        try:
            return domain_class(self.domain).questionnaire_inputs
        except ValueError:
            return ()

    def questionnaire_items(self):
        """The items participants answer, in order; none when the study has no questionnaire."""
        if not hasattr(self, "questionnaire"):
            return Item.objects.none()
        return self.questionnaire.items.all()

    def code(self, ending: str) -> str:
        """The code the study gives at that Ending, or "" when it has none."""
        pending = self.__dict__.get("_pending_codes", {})
        if ending in pending:
            return pending[ending]
        if not self.pk:
            return ""
        row = self.completion_codes.filter(ending=ending).first()
        return row.code if row else ""

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        for ending, code in self.__dict__.pop("_pending_codes", {}).items():
            if code:
                CompletionCode.objects.update_or_create(
                    study=self,
                    ending=ending,
                    defaults={"code": code, "code_type": ENDING_CODE_TYPES[ending]},
                )
            else:
                CompletionCode.objects.filter(study=self, ending=ending).delete()

    def _set_code(self, ending: str, code: str) -> None:
        self.__dict__.setdefault("_pending_codes", {})[ending] = (code or "").strip()

    @staticmethod
    def _code_of(ending: str) -> property:
        return property(
            lambda self: self.code(ending), lambda self, code: self._set_code(ending, code)
        )

    def participant_link(self, base_url: str | None = None) -> str:
        base = (base_url or settings.PUBLIC_URL).rstrip("/")
        return f"{base}/s/{self.slug}/"


class Ending(models.TextChoices):
    """The ways a participant leaves a study that hand out a completion code."""

    COMPLETED = "completed", "Completed"
    FAILED_ATTENTION = "failed_attention", "Completed, failing attention checks as Prolific allows"
    NO_CONSENT = "no_consent", "Declined consent"
    TIMED_OUT = "timed_out", "Timed out"
    PROBLEM = (
        "problem",
        "Could not go on (every problem page); declined or timed out without a code",
    )


# The fields studies had before codes were CompletionCode rows stay readable and settable
# (Study(completion_code=...) stores its row on save): the code of each Ending.
for _field, _ending in (
    ("completion_code", Ending.COMPLETED),
    ("no_consent_code", Ending.NO_CONSENT),
    ("timeout_code", Ending.TIMED_OUT),
    ("other_code", Ending.PROBLEM),
):
    setattr(Study, _field, Study._code_of(_ending))


class CodeType(models.TextChoices):
    """Prolific's completion code types."""

    COMPLETED = "COMPLETED", "Completed"
    FAILED_ATTENTION_CHECK = "FAILED_ATTENTION_CHECK", "Failed attention check"
    FOLLOW_UP_STUDY = "FOLLOW_UP_STUDY", "Follow-up study"
    GIVE_BONUS = "GIVE_BONUS", "Give bonus"
    INCOMPATIBLE_DEVICE = "INCOMPATIBLE_DEVICE", "Incompatible device"
    NO_CONSENT = "NO_CONSENT", "No consent"
    OTHER = "OTHER", "Other"
    FIXED_SCREENOUT = "FIXED_SCREENOUT", "Fixed screen-out"


# The code type of an Ending's code unless the researcher chooses another (Prolific has no
# time-out type: OTHER, as for the problem pages).
ENDING_CODE_TYPES = {
    Ending.COMPLETED: CodeType.COMPLETED,
    Ending.FAILED_ATTENTION: CodeType.FAILED_ATTENTION_CHECK,
    Ending.NO_CONSENT: CodeType.NO_CONSENT,
    Ending.TIMED_OUT: CodeType.OTHER,
    Ending.PROBLEM: CodeType.OTHER,
}


class CompletionCode(models.Model):
    """A code of the study on Prolific, of one of Prolific's code types, with its redirect to
    Prolific's completion page. `ending` is when parley gives it; a code without one is used on
    Prolific only (listed here with its redirect). `action`: what Prolific does with it."""

    class Action(models.TextChoices):
        AUTOMATICALLY_APPROVE = "AUTOMATICALLY_APPROVE", "Automatically approve"
        MANUALLY_REVIEW = "MANUALLY_REVIEW", "Manually review"
        REQUEST_RETURN = "REQUEST_RETURN", "Request return"
        ADD_TO_PARTICIPANT_GROUP = "ADD_TO_PARTICIPANT_GROUP", "Add to participant group"
        REMOVE_FROM_PARTICIPANT_GROUP = "REMOVE_FROM_PARTICIPANT_GROUP", "Remove from group"
        DYNAMIC_PAYMENT = "DYNAMIC_PAYMENT", "Dynamic payment"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="completion_codes")
    code_type = models.CharField(max_length=24, choices=CodeType.choices)
    code = models.CharField(
        max_length=64, validators=[RegexValidator(r"^[A-Za-z0-9_-]+$", "Letters, digits, _ and -.")]
    )
    ending = models.CharField(
        max_length=20,
        choices=Ending.choices,
        blank=True,
        help_text="When parley gives this code; blank: used on Prolific only.",
    )
    action = models.CharField(
        max_length=32, choices=Action.choices, blank=True, help_text="As set on Prolific."
    )

    class Meta:
        ordering = ["study", "code_type", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["study", "ending"],
                condition=~models.Q(ending=""),
                name="one_code_per_ending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.code_type}: {self.code}"

    @property
    def redirect_url(self) -> str:
        return COMPLETE_URL.format(code=self.code)


class ToolChoice(models.TextChoices):
    """How an arm's agent is asked to call the Domain's tools, step by step within one reply
    (a step is one request to the engine; the Domain caps the calls of a reply)."""

    AUTO = "auto", "The agent decides at every step"
    FIRST = "first", "Each reply starts with a tool call, then the agent decides"
    REQUIRED = "required", "Tool calls until the Domain's per-reply budget is spent, then text"


class Arm(models.Model):
    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="arms")
    name = models.CharField(max_length=64)
    order = models.PositiveSmallIntegerField(default=0)
    active = models.BooleanField(default=True, help_text="Inactive arms get no new participants.")
    endpoint = models.ForeignKey(
        ModelEndpoint,
        on_delete=models.PROTECT,
        related_name="arms",
        blank=True,  # saved blank: the default endpoint (PARLEY_ENGINE_URL)
        help_text="The model endpoint serving this arm; blank: the default (PARLEY_ENGINE_URL).",
    )
    model_name = models.CharField(
        max_length=200, help_text="Base model or LoRA adapter name, as the endpoint lists it."
    )
    system_prompt = models.TextField(blank=True)
    greeting = models.TextField(
        blank=True, help_text="Optional fixed opening message of the agent."
    )
    temperature = models.FloatField(
        default=0.7, validators=[MinValueValidator(0), MaxValueValidator(2)]
    )
    top_p = models.FloatField(
        default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(1)]
    )
    max_tokens = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    extra_params = models.JSONField(default=dict, blank=True, help_text="More request parameters.")
    tool_format = models.CharField(
        max_length=10,
        choices=[
            ("native", "Native OpenAI tools"),
            ("json", "JSON tool calls in the prompt"),
            ("structured", "JSON tool calls kept well formed by the engine"),
        ],
        default="json",
        help_text="Models without native tool calling (e.g. SmolLM2) use the JSON format; "
        "'structured' has the engine (vLLM or embedded) constrain each call to a tool's schema. "
        "Native tools on vLLM need a model with tool calling and `--tool-call-parser`.",
    )
    tool_choice = models.CharField(
        max_length=10,
        choices=ToolChoice.choices,
        default=ToolChoice.AUTO,
        help_text="How the agent is asked to use the Domain's tools in each reply. A small model "
        "left to decide (e.g. SmolLM2) seldom calls one; 'first' and 'required' make the engine "
        "write a call (tool format 'structured' or 'native'). Ignored in a Domain without tools.",
    )

    class Meta:
        ordering = ["study", "order", "id"]
        constraints = [models.UniqueConstraint(fields=["study", "name"], name="unique_arm_name")]

    def __str__(self) -> str:
        return f"{self.study.slug}/{self.name}"

    @classmethod
    def from_db(cls, db, field_names, values):
        arm = super().from_db(db, field_names, values)
        arm._stored_target = (arm.__dict__.get("endpoint_id"), arm.__dict__.get("model_name"))
        return arm

    def save(self, *args, **kwargs):
        if self.endpoint_id is None:
            self.endpoint = ModelEndpoint.default()
        super().save(*args, **kwargs)
        self._stored_target = (self.endpoint_id, self.model_name)

    def retargeted(self) -> bool:
        """New, or pointed at another endpoint or model than the one stored."""
        return getattr(self, "_stored_target", None) != (self.endpoint_id, self.model_name)

    def clean(self):
        if not isinstance(self.extra_params, dict):
            raise ValidationError({"extra_params": "Must be a JSON object."})
        errors: dict[str, list[str]] = {"extra_params": [], "tool_choice": [], "tool_format": []}
        if "tool_choice" in self.extra_params:
            errors["extra_params"].append("Set how tools are called in the Tool choice field.")
        if self.tool_choice != ToolChoice.AUTO and self.tool_format == "json":
            errors["tool_choice"].append(
                f"Tool choice {self.tool_choice!r} needs the tool format 'structured' or "
                "'native': with calls only described in the prompt nothing makes the model "
                "write one."
            )
        trained = self.trained_tool_format()
        if trained == "native" and self.tool_format != "native":
            errors["tool_format"].append(
                f"Checkpoint {self.model_name} was trained with its chat template's native tool "
                "calls: use 'native' (vLLM serves it with --tool-call-parser hermes)."
            )
        elif trained == "json" and self.tool_format == "native":
            errors["tool_format"].append(
                f"Checkpoint {self.model_name} was trained with the JSON tool format: use 'json' "
                "or 'structured'."
            )
        endpoint = self.endpoint if self.endpoint_id else None
        if "seed" in self.extra_params and endpoint and endpoint.kind == ModelEndpoint.Kind.VLLM:
            errors["extra_params"].append(
                f"Remove 'seed': endpoint {endpoint} is vLLM, whose CPU build crashes on a "
                "seeded request with a long prompt (CPU Generator does not use offset); "
                "vLLM arms are never sent a seed."
            )
        errors = {name: problems for name, problems in errors.items() if problems}
        if errors:
            raise ValidationError(errors)
        # Only an arm being pointed somewhere is checked: an unchanged arm on an endpoint that
        # is down just now must not block saving the rest of its study (pausing it, say).
        problem = self.model_problem() if self.retargeted() else None
        if problem and arm_model_check() != "warn":
            raise ValidationError({"model_name": f"Refused: {problem}."})

    def trained_tool_format(self) -> str | None:
        """How the checkpoint this arm serves was trained to call tools ("json" | "native", its
        manifest's tool_format), or None: not a registered checkpoint, or written before
        checkpoints recorded it."""
        manifest = (
            Checkpoint.objects.filter(name=self.model_name)
            .values_list("manifest", flat=True)
            .first()
        )
        return (manifest or {}).get("tool_format")

    def model_problem(self, refresh: bool = True) -> str | None:
        """Why no healthy replica of the arm's endpoint serves its model (None: one does);
        `refresh`: the replicas are checked first if their stored health is stale."""
        if not self.model_name:
            return None  # the field's own "required" says so
        endpoint = self.endpoint if self.endpoint_id else ModelEndpoint.default()
        return endpoint.model_problem(self.model_name, refresh=refresh)

    def generation_params(self) -> dict:
        extra = self.extra_params
        if "seed" in extra and self.endpoint.kind == ModelEndpoint.Kind.VLLM:
            # clean() refuses it, but an arm pointed at vLLM later (serve_agents) may hold one
            extra = {k: v for k, v in extra.items() if k != "seed"}
        return {
            **extra,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }

    def forces_tool_call(self, step: int) -> bool:
        """Whether step `step` (0: the reply's first request) of a reply must be a tool call."""
        return self.tool_choice == ToolChoice.REQUIRED or (
            self.tool_choice == ToolChoice.FIRST and step == 0
        )


class Scenario(models.Model):
    """One task of the study's pool: a tau2 task, a P4G persona, or a free-chat topic."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="scenarios")
    key = models.CharField(max_length=100)
    title = models.CharField(max_length=200, blank=True)
    domain = models.CharField(max_length=20, choices=domain_choices, default=Study.OPEN_CHAT)
    payload = models.JSONField(default=dict, blank=True)
    source = models.CharField(
        max_length=500,
        blank=True,
        help_text="Folder of the official data it came from; blank: bundled.",
    )
    instructions = models.TextField(
        blank=True, help_text="Shown to the participant in the side panel."
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["study", "id"]
        constraints = [models.UniqueConstraint(fields=["study", "key"], name="unique_scenario_key")]

    def __str__(self) -> str:
        return self.title or self.key


class Questionnaire(models.Model):
    study = models.OneToOneField(Study, on_delete=models.CASCADE, related_name="questionnaire")
    title = models.CharField(max_length=200, default="A few questions about the conversation")
    intro = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.study.slug}: {self.title}"


class Item(models.Model):
    class Kind(models.TextChoices):
        LIKERT = "likert", "Likert scale"
        NUMBER = "number", "Number"
        TEXT = "text", "Free text"
        ATTENTION = "attention", "Attention check"

    questionnaire = models.ForeignKey(Questionnaire, on_delete=models.CASCADE, related_name="items")
    order = models.PositiveSmallIntegerField(default=0)
    key = models.SlugField(max_length=64, help_text="Column name in exports and analysis.")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.LIKERT)
    prompt = models.TextField()
    scale_points = models.PositiveSmallIntegerField(
        default=7, validators=[MinValueValidator(2), MaxValueValidator(11)]
    )
    anchor_low = models.CharField(max_length=100, blank=True, default="Strongly disagree")
    anchor_high = models.CharField(max_length=100, blank=True, default="Strongly agree")
    anchor_labels = models.JSONField(
        default=list, blank=True, help_text="Optional label for every point, low to high."
    )
    reverse_coded = models.BooleanField(default=False)
    min_value = models.FloatField(null=True, blank=True)
    max_value = models.FloatField(null=True, blank=True)
    required = models.BooleanField(default=True)
    expected_answer = models.CharField(
        max_length=100, blank=True, help_text="Attention check: the point (1..k) to choose."
    )
    domain_input = models.CharField(
        "answers the task's",
        max_length=40,
        blank=True,
        choices=domain_input_choices,
        help_text="Which answer the study's task reads from this item (P4G: the donation, the "
        "participant's outcome). Going live checks that each one the task needs has an item.",
    )

    class Meta:
        ordering = ["questionnaire", "order", "id"]
        constraints = [
            models.UniqueConstraint(fields=["questionnaire", "key"], name="unique_item_key"),
            models.UniqueConstraint(
                fields=["questionnaire", "domain_input"],
                condition=~models.Q(domain_input=""),
                name="one_item_per_domain_input",
                violation_error_message="Another item already answers this for the task.",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def is_scale(self) -> bool:
        return self.kind in (self.Kind.LIKERT, self.Kind.ATTENTION)

    def clean(self):
        errors = {}
        if self.anchor_labels and (
            not isinstance(self.anchor_labels, list) or len(self.anchor_labels) != self.scale_points
        ):
            errors["anchor_labels"] = f"Give a list of exactly {self.scale_points} labels, or none."
        if self.kind == self.Kind.ATTENTION:
            try:
                expected = int(self.expected_answer)
            except ValueError:
                expected = 0
            if not 1 <= expected <= self.scale_points:
                errors["expected_answer"] = (
                    f"An attention check needs a point from 1 to {self.scale_points}."
                )
        if (
            self.min_value is not None
            and self.max_value is not None
            and self.min_value > self.max_value
        ):
            errors["min_value"] = "Must not exceed max_value."
        if self.domain_input and self.questionnaire_id and not errors:
            study = self.questionnaire.study
            need = {n.name: n for n in study.domain_inputs()}.get(self.domain_input)
            problem = (
                self.input_problem(need)
                if need
                else f"The study's task ({study.get_domain_display()}) reads no such answer."
            )
            if problem:
                errors["domain_input"] = problem
        if errors:
            raise ValidationError(errors)

    def answer_range(self) -> tuple[float | None, float | None]:
        """The lowest and highest answer this item accepts (None: no bound)."""
        if self.is_scale:
            return 1, self.scale_points
        return self.min_value, self.max_value

    def input_problem(self, need: QuestionnaireInput) -> str | None:
        """Why this item cannot supply the Domain's `need` (every answer it accepts must be one
        the Domain can use, and every participant must give one), or None."""
        if self.kind not in (self.Kind.NUMBER, self.Kind.LIKERT):
            return f"A {self.get_kind_display().lower()} item cannot hold {need.describe()}."
        low, high = self.answer_range()
        if low is None or high is None or low < need.min_value or high > need.max_value:
            shown = (
                f"{'-' if low is None else f'{low:g}'} to {'-' if high is None else f'{high:g}'}"
            )
            return (
                f"Its answers ({shown}) must lie within {need.min_value:g} to "
                f"{need.max_value:g}: it holds {need.describe()}. Set its min and max values."
            )
        if not self.required:
            return f"It must be required: it holds {need.describe()}."
        return None

    def labels(self) -> list[str]:
        """One label per point: the full list if given, else the anchors at the ends."""
        if self.anchor_labels:
            return list(self.anchor_labels)
        labels = [""] * self.scale_points
        labels[0], labels[-1] = self.anchor_low, self.anchor_high
        return labels


def only_people(via: str = "") -> models.Q:
    """The participants who are data: not bots (rehearsals, studies/rehearsal/bots.py) and not previews
    (staff walking the flow). `via`: the path to them from the queried model, e.g.
    "participants" from Arm or Study."""
    prefix = f"{via}__" if via else ""
    return models.Q(**{f"{prefix}is_bot": False, f"{prefix}is_preview": False})


def humans_unless(participants, include_bots: bool):
    """Bot participants are rehearsal data: out of exports and analyses unless asked for.
    Previews are never data."""
    return (
        participants.filter(is_preview=False)
        if include_bots
        else participants.filter(only_people())
    )


class Participant(models.Model):
    class Status(models.TextChoices):
        CONSENT = "consent", "Reading consent"
        CHAT = "chat", "Chatting"
        QUESTIONNAIRE = "questionnaire", "Answering questionnaire"
        COMPLETED = "completed", "Completed"
        NO_CONSENT = "no_consent", "Declined consent"
        TIMED_OUT = "timed_out", "Timed out"
        # The study could not start them (e.g. no scenario yet): they hold no place, and take
        # one again when they come back and the study can start them.
        UNSTARTED = "unstarted", "Could not start"
        RETURNED = "returned", "Returned on Prolific"

    # Those who hold a place in their arm (the least-filled assignment counts them).
    ACTIVE = (Status.CONSENT, Status.CHAT, Status.QUESTIONNAIRE, Status.COMPLETED)
    # Those still on their way: the time limit applies to them.
    UNFINISHED = (Status.CONSENT, Status.CHAT, Status.QUESTIONNAIRE)

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="participants")
    arm = models.ForeignKey(Arm, on_delete=models.PROTECT, related_name="participants")
    scenario = models.ForeignKey(
        Scenario, null=True, blank=True, on_delete=models.PROTECT, related_name="participants"
    )
    token = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    prolific_pid = models.CharField("PROLIFIC_PID", max_length=64)
    prolific_study_id = models.CharField("STUDY_ID", max_length=64)
    prolific_session_id = models.CharField("SESSION_ID", max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CONSENT)
    attention_passed = models.BooleanField(null=True, blank=True)
    outcome = models.JSONField(null=True, blank=True, help_text="The Domain's Outcome.")
    # Set on arrival from a PROLIFIC_PID only this server can sign (studies/rehearsal/bots.py): rehearsal
    # participants, left out of arm balance, exports and analysis unless asked for.
    is_bot = models.BooleanField(default=False, editable=False)
    # The submission's status on Prolific (studies/prolific/sync.py keeps it, by webhook and sync).
    prolific_status = models.CharField(max_length=24, blank=True, editable=False)
    prolific_synced_at = models.DateTimeField(null=True, blank=True, editable=False)
    partial_data = models.BooleanField(
        default=False,
        editable=False,
        help_text="Returned or timed out on Prolific: what was gathered is kept, flagged, and its "
        "place freed.",
    )
    # Opened by staff from the study page on a fixed arm: the real flow, but never counted in
    # assignment, caps, exports or analysis.
    is_preview = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    consented_at = models.DateTimeField(null=True, blank=True)
    chat_ended_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["study", "prolific_pid"], name="one_participant_per_pid"
            )
        ]
        indexes = [models.Index(fields=["study", "arm", "status"])]

    def __str__(self) -> str:
        return self.prolific_pid

    @property
    def deadline(self):
        return self.created_at + timedelta(minutes=self.study.time_limit_minutes)

    def is_overdue(self) -> bool:
        return self.status in self.UNFINISHED and timezone.now() > self.deadline

    def seconds_left(self) -> int:
        """Whole seconds until the time limit (0 once it has passed)."""
        return max(0, int((self.deadline - timezone.now()).total_seconds()))


class StudyError(models.Model):
    """A problem a participant met (shown a friendly page instead), kept for the researcher."""

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="errors")
    participant = models.ForeignKey(
        Participant, null=True, blank=True, on_delete=models.SET_NULL, related_name="errors"
    )
    path = models.CharField(max_length=500, blank=True)
    title = models.CharField(max_length=200)
    detail = models.TextField(blank=True)
    traceback = models.TextField(blank=True, help_text="Unexpected errors only.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["study", "-created_at"])]

    def __str__(self) -> str:
        return self.title


class Conversation(models.Model):
    participant = models.OneToOneField(
        Participant, on_delete=models.CASCADE, related_name="conversation"
    )
    state = models.JSONField(
        null=True, blank=True, help_text="This conversation's own Domain state."
    )
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, blank=True)

    def __str__(self) -> str:
        return f"conversation of {self.participant}"


TIME_LIMIT = "time limit"  # a Conversation's end_reason when its participant ran out of time


def time_out_overdue(participants=None, now=None) -> list[int]:
    """Time out the unfinished participants past their study's time limit (all of them, or those
    of the `participants` queryset), freeing their arm places; returns their ids.

    The periodic task and every page load call this. Rows a flow step holds locked are skipped
    (that step decides; the next sweep looks again), so a participant finishing right at the
    limit is never timed out after completing. Their conversation ends, with all it holds.
    """
    now = now or timezone.now()
    participants = (Participant.objects.all() if participants is None else participants).filter(
        status__in=Participant.UNFINISHED
    )
    limits = (
        Study.objects.filter(participants__in=participants)
        .order_by()
        .values_list("pk", "time_limit_minutes")
        .distinct()
    )
    overdue = models.Q(pk__in=[])
    for study_id, minutes in limits:
        overdue |= models.Q(study_id=study_id, created_at__lt=now - timedelta(minutes=minutes))
    with transaction.atomic():
        ids = list(
            participants.filter(overdue)
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)
        )
        Participant.objects.filter(pk__in=ids).update(status=Participant.Status.TIMED_OUT)
        Conversation.objects.filter(participant_id__in=ids, ended_at__isnull=True).update(
            ended_at=now, end_reason=TIME_LIMIT
        )
    return ids


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "Participant"
        ASSISTANT = "assistant", "Agent"
        TOOL = "tool", "Tool result"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    client_id = models.CharField(max_length=64, null=True, blank=True)
    reply_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="replies"
    )
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    tool_name = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    replica = models.CharField(
        max_length=500, blank=True, help_text="Base URL of the replica that served this reply."
    )
    finish_reason = models.CharField(max_length=32, blank=True)
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="unique_message_seq"),
            models.UniqueConstraint(
                fields=["conversation", "client_id"],
                condition=models.Q(client_id__isnull=False),
                name="unique_client_message",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}"

    def to_chat(self) -> dict:
        """The OpenAI-style message the Domain and the model see."""
        message = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.role == self.Role.TOOL:
            message.update(tool_call_id=self.tool_call_id, name=self.tool_name)
        return message

    def to_client(self) -> dict:
        """What the participant's browser receives."""
        return {
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "client_id": self.client_id,
            "tool_calls": self.tool_calls or [],
            "tool_name": self.tool_name,
        }


class Response(models.Model):
    participant = models.ForeignKey(Participant, on_delete=models.CASCADE, related_name="responses")
    item = models.ForeignKey(Item, on_delete=models.PROTECT, related_name="responses")
    value_number = models.FloatField(null=True, blank=True)
    value_text = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["participant", "item"], name="one_response_per_item")
        ]

    def __str__(self) -> str:
        return f"{self.participant} {self.item.key}"

    @property
    def value(self):
        return self.value_text if self.item.kind == Item.Kind.TEXT else self.value_number


class AnalysisRun(models.Model):
    """One computation of a study's analysis, kept with its inputs so it can be redone."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    class Trigger(models.TextChoices):
        MANUAL = "manual", "Started by a researcher"
        TARGET = "target", "Study reached its target"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="analysis_runs")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=10, choices=Trigger.choices, default=Trigger.MANUAL)
    settings = models.JSONField(default=dict, blank=True)
    inputs = models.JSONField(default=dict, blank=True, help_text="The participant table analysed.")
    results = models.JSONField(null=True, blank=True)
    figures = models.JSONField(default=dict, blank=True, help_text="SVG figures by name.")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One automatic analysis per study, however many last completions race to start it.
            models.UniqueConstraint(
                fields=["study"],
                condition=models.Q(trigger="target"),
                name="one_automatic_analysis_per_study",
            )
        ]

    def __str__(self) -> str:
        return f"analysis #{self.pk} of {self.study.slug}"


class SimulatorEvaluation(models.Model):
    """One conversation of an arm's checkpoint with one of its training run's held-out
    simulators on one scenario of the study's pool, scored by the Domain (the sim-to-real gap
    report, studies/research/simulator_evaluations.py). Kept so that a report never plays a conversation twice: the
    key is (arm, checkpoint, simulator, scenario, sample)."""

    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="simulator_evaluations")
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, related_name="simulator_evaluations"
    )
    simulator = models.CharField(max_length=100, help_text="Its name in the run's held-out panel.")
    scenario = models.ForeignKey(
        Scenario, on_delete=models.CASCADE, related_name="simulator_evaluations"
    )
    sample = models.PositiveIntegerField(
        default=0, help_text="Which conversation of this scenario."
    )
    spec = models.JSONField(
        default=dict, help_text="The held-out simulator as the run declared it."
    )
    success = models.BooleanField()
    reward = models.FloatField()
    outcome = models.JSONField(default=dict, help_text="The Domain's score, in full.")
    end_reason = models.CharField(max_length=40, blank=True)
    conversation = models.JSONField(default=list, help_text="The messages, as the Domain saw them.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["arm", "simulator", "scenario", "sample"]
        constraints = [
            models.UniqueConstraint(
                fields=["arm", "checkpoint", "simulator", "scenario", "sample"],
                name="one_evaluation_per_conversation",
            )
        ]

    def __str__(self) -> str:
        return f"{self.arm} x {self.simulator} on {self.scenario_id}#{self.sample}"


# --- Prolific: webhook events, review decisions, bonuses (studies/prolific/sync.py) ------------


class ProlificEvent(models.Model):
    """A webhook Prolific delivered, kept by its X-Event-ID so a redelivery is acknowledged
    without acting twice."""

    event_id = models.CharField(max_length=128, unique=True)
    event_type = models.CharField(max_length=64)
    resource_id = models.CharField(max_length=64, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    result = models.CharField(max_length=200, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"


class Review(models.Model):
    """A researcher's decision on a submission, sent to Prolific by a task (an outbox: the
    transitions are idempotent on Prolific's side, so sending again after a crash is safe)."""

    class Action(models.TextChoices):
        APPROVE = "APPROVE", "Approve"
        REJECT = "REJECT", "Reject"

    class State(models.TextChoices):
        PENDING = "pending", "Waiting to be sent"
        SENT = "sent", "Sent to Prolific"
        FAILED = "failed", "Refused by Prolific"

    participant = models.OneToOneField(Participant, on_delete=models.CASCADE, related_name="review")
    action = models.CharField(max_length=10, choices=Action.choices)
    message = models.TextField(blank=True)
    rejection_category = models.CharField(max_length=24, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.action} {self.participant}"


class BonusPayment(models.Model):
    """One batch of bonuses: set up on Prolific (its id stored before paying), then paid once."""

    class State(models.TextChoices):
        NEW = "new", "Not set up yet"
        SET_UP = "set_up", "Set up, not paid"
        PAYING = "paying", "Pay sent, not confirmed"
        PAID = "paid", "Paid"
        FAILED = "failed", "Refused by Prolific"

    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="bonus_payments")
    source = models.CharField(max_length=200, help_text="The rule or the CSV file it came from.")
    state = models.CharField(max_length=10, choices=State.choices, default=State.NEW)
    setup_id = models.CharField(max_length=64, blank=True)
    # A set-up Prolific refused leaves its participants free to be bonused by a corrected file;
    # its lines are kept here, [participant id, amount], for the record.
    refused_lines = models.JSONField(default=list, blank=True)
    total_amount = models.PositiveIntegerField(null=True, blank=True, help_text="pence/cents")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    set_up_at = models.DateTimeField(null=True, blank=True)
    pay_sent_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"bonuses #{self.pk} of {self.study.slug}"


class Bonus(models.Model):
    """One participant's bonus: at most one per (study, participant), whatever is uploaded."""

    payment = models.ForeignKey(BonusPayment, on_delete=models.CASCADE, related_name="bonuses")
    study = models.ForeignKey(Study, on_delete=models.CASCADE, related_name="+")
    participant = models.ForeignKey(Participant, on_delete=models.PROTECT, related_name="bonuses")
    amount = models.DecimalField(max_digits=8, decimal_places=2, help_text="pounds/dollars")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["study", "participant"], name="one_bonus_per_participant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.participant}: {self.amount}"


# --- pre-registration (issue 14): the frozen plan and what it freezes ------------------------------

# What a freeze holds fixed, per model: the design of the study and its analysis plan. Arms'
# endpoints and keys are left out (an engine may move host); statuses and texts too.
FROZEN_STUDY_FIELDS = (
    "domain",
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
# Items a plan holds: the measures and the attention checks (an exclusion rule); free text is
# neither.
PLANNED_ITEM_KINDS = (Item.Kind.LIKERT, Item.Kind.NUMBER, Item.Kind.ATTENTION)


def frozen_values(instance) -> dict:
    """The frozen fields of a Study, Arm or Item as JSON values (the control arm by name)."""
    if isinstance(instance, Study):
        values = {name: getattr(instance, name) for name in FROZEN_STUDY_FIELDS}
        values["control_arm"] = instance.control_arm.name if instance.control_arm_id else None
    else:
        names = FROZEN_ARM_FIELDS if isinstance(instance, Arm) else FROZEN_ITEM_FIELDS
        values = {name: getattr(instance, name) for name in names}
    return json.loads(json.dumps(values))  # as stored and read back: 7 and 7.0 compare alike


def _study_of(instance) -> Study | None:
    if isinstance(instance, Study):
        return instance
    if isinstance(instance, Arm):
        return instance.study if instance.study_id else None
    questionnaire = instance.questionnaire if instance.questionnaire_id else None
    return questionnaire.study if questionnaire else None


def frozen_changes(instance, deleting: bool = False) -> dict[str, str]:
    """What a save (or a delete) of this Study, Arm or Item would change in its study's frozen
    plan, by field, in words; empty when the study is not frozen or nothing frozen changes."""
    if not isinstance(instance, Study | Arm | Item):
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
    if isinstance(instance, Study):
        before = plan.plan["study"]
    else:
        kind = "arm" if isinstance(instance, Arm) else "item"
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


@receiver(pre_save, sender=Study)
@receiver(pre_save, sender=Arm)
@receiver(pre_save, sender=Item)
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

    study = models.OneToOneField(Study, on_delete=models.CASCADE, related_name="preregistration")
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
