"""A study and what it is made of: its arms, completion codes and scenario pool."""

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from agents.domains import STUDY_DOMAINS, QuestionnaireInput, domain_class
from agents.domains import domain_choices as registered_domains
from agents.models import Checkpoint, ModelEndpoint
from studies.models.frozen_plan import Preregistration, frozen_changes
from studies.models.questionnaire import Item

COMPLETE_URL = "https://app.prolific.com/submissions/complete?cc={code}"
MAX_RETENTION_DAYS = 3650  # ten years: longer is a mistake in the field, not a policy


def domain_choices() -> list[tuple[str, str]]:
    """Open chat, then every Domain people can take part in, from the one registry."""
    return [(Study.OPEN_CHAT, "Open chat (no task)"), *registered_domains(STUDY_DOMAINS)]


def protocol_choices() -> list[tuple[str, str]]:
    """Every protocol of the Domains people can take part in (P4G: "parley", "release"), for
    Study.domain_protocol; which one a study may pick depends on its domain (Study.clean)."""
    choices: dict[str, str] = {}
    for name in STUDY_DOMAINS:
        for protocol, text in domain_class(name).protocols.items():
            choices.setdefault(protocol, f"{protocol}: {text}")
    return list(choices.items())


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
    domain_protocol = models.CharField(
        "task protocol",
        max_length=20,
        blank=True,
        default="",
        choices=protocol_choices,
        help_text="Which of the task's protocols the agent (and any simulated participant) "
        "follows; blank = the task's default. P4G: parley's honest persuader (the default, made "
        "for people) or the paper's released task (persuader persona, bonus, 50 words; needs the "
        "official data with the release's split as the scenarios' source).",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.DRAFT)
    target_per_arm = models.PositiveIntegerField(default=20, validators=[MinValueValidator(1)])
    prolific_study_id = models.CharField(
        max_length=64, blank=True, help_text="If set, links whose STUDY_ID differs are refused."
    )
    consent_text = models.TextField(
        default="You are invited to take part in a short research study."
    )
    instructions = models.TextField(blank=True, help_text="Shown beside the chat.")
    pays_partial = models.BooleanField(
        "pays for partial participation",
        default=False,
        help_text="A participant who stops taking part is given the completion code (and so "
        "paid). Unticked: they are asked to return their submission on Prolific.",
    )
    retention_days = models.PositiveIntegerField(
        "retention period (days)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_RETENTION_DAYS)],
        help_text="Days after each participant's arrival until their identifying data (Prolific "
        "ids, link, free-text answers marked identifying) is purged; the rest stays, under "
        "pseudonymous ids. Going live needs it.",
    )
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
        if self.domain_protocol:
            known = domain_class(self.domain).protocols if self.domain != self.OPEN_CHAT else {}
            if self.domain_protocol not in known:
                errors["domain_protocol"] = (
                    f"The task ({self.get_domain_display()}) has no protocol "
                    f"{self.domain_protocol!r}"
                    + (f"; choose one of {', '.join(known)}." if known else ": leave it blank.")
                )
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

    @property
    def rates_conversations(self) -> bool:
        """An annotation study: its participants rate stored conversations. Its Domain is the
        rated conversations' (it names their speakers); it gives nobody a task, so it needs no
        scenarios and reads no answer from the questionnaire."""
        return hasattr(self, "annotation")

    def needs_scenarios(self) -> bool:
        """A chat study with a Domain gives each participant one of its tasks; open chat and
        annotation studies need none."""
        return self.domain != self.OPEN_CHAT and not self.rates_conversations

    def domain_inputs(self) -> tuple[QuestionnaireInput, ...]:
        """What the study's Domain reads from the questionnaire (none for open chat, for an
        annotation study, or for a domain no longer registered: the go-live checks name that)."""
        if self.domain == self.OPEN_CHAT or self.rates_conversations:
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
        codes = self.__dict__.get("_codes")
        if codes is None:  # every code in one read: a page may ask for two or three
            codes = self.remember_codes(self.completion_codes.values_list("ending", "code"))
        return codes.get(ending, "")

    def knows_codes(self) -> bool:
        return "_codes" in self.__dict__

    def remember_codes(self, rows) -> dict[str, str]:
        """(ending, code) rows read elsewhere (a participant page's compiled read), kept as
        this instance's codes until it is saved or refreshed."""
        codes = self.__dict__["_codes"] = dict(rows)
        return codes

    def refresh_from_db(self, *args, **kwargs):
        self.__dict__.pop("_codes", None)
        super().refresh_from_db(*args, **kwargs)

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        self.__dict__.pop("_codes", None)  # what the instance read before may have changed
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
