"""A training run is one RunConfig; this is its schema, and training/config.py loads it from TOML.

    name = "p4g-single-cpu"
    domain = "p4g"
    regime = "single"            # single | persona | ensemble | verbalized | cotrain | population
    steps = 8
    group_size = 4               # G rollouts per task
    batch_tasks = 1              # tasks per step
    [tasks]    train_split / eval_split / train_ids / eval_ids / max_train / max_eval
    [simulator] the training simulator (see agents/simulators/spec.py SimulatorSpec)
    [[ensemble]] regime "ensemble": its K frozen simulators, one table each
    [[heldout]] the held-out panel, one table per simulator
    [lora]     r / alpha / dropout / targets  (finetune = "full" trains every weight instead)
    [collapse] the diversity warnings' thresholds, an optional embedding model (CollapseSpec)
    [behaviour] COLLAPSE-AWARE behaviour profiles (BehaviourSpec)
    [synthesis] COLLAPSE-AWARE anti-collapse simulator supplies (SynthesisSpec)

Each field is declared once, with its help and bounds beside it (pydantic dataclasses, so
`dataclasses.replace` and `asdict` keep working). Loading is in training/config.py, above this:
a config enters only through its `parse_config`, which validates a table against these fields
and turns a refusal into a ConfigError naming the key, the value and what is allowed.
ConfigError, the dotted keys of overrides and the wording of what a field allows are in
training/config_keys.py, below this.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from agents.domains import DOMAINS, Domain, domain_class, get_domain
from agents.domains.episode import MAX_TOOL_ROUNDS, MAX_TURNS
from agents.domains.tau2.taskset import TAU2_DOMAINS
from agents.domains.tau2.versions import NL_JUDGED, task_version
from agents.llm.native_tools import TRAINED_TOOL_FORMATS
from agents.paths import secret
from agents.simulators.spec import (
    TABLE,
    Name,
    ProviderName,
    SimulatorKind,
    SimulatorSpec,
    one_of,
    refuse,
)
from training.config_keys import ConfigError
from training.vocabulary import (
    CURATION_GATES,
    DISTRIBUTED_STRATEGIES,
    DTYPES,
    ENSEMBLE_DRAWS,
    EVAL_DRAWS,
    FINETUNE,
    HELDOUT_USERS,
    KL_ESTIMATOR_NAMES,
    LOSS_REDUCTIONS,
    SIMULATOR_REWARDS,
    SIMULATOR_UPDATES,
    TASK_DRAWS,
    WEIGHT_SYNC_BACKENDS,
    Regime,
)


def regime_choices() -> list[tuple[str, str]]:
    """(name, label) of every regime, for Django choices (named by the migrations)."""
    return Regime.choices()


def simulator_api_key(spec: SimulatorSpec) -> str | None:
    """An endpoint simulator's API key, read from the variable its spec names; a run reads it as
    it starts, so a missing one fails the run before any step, naming the variable."""
    if not spec.api_key_env:
        return None
    key = secret(spec.api_key_env)
    if not key:
        raise ConfigError(
            f"simulator {spec.name!r}: environment variable {spec.api_key_env} is not set",
            "api_key_env",
        )
    return key


def _known_domain(name: str) -> str:
    # the registry is read at validation time: a Domain registered later (a test's) counts too
    if name not in DOMAINS:
        raise PydanticCustomError(
            "domain", "must be one of {allowed}", {"allowed": one_of(DOMAINS)}
        )
    return name


DomainName = Annotated[StrictStr, AfterValidator(_known_domain)]
RegimeName = Literal[tuple(r.value for r in Regime)]
EnsembleDraw = Literal[tuple(ENSEMBLE_DRAWS)]
TaskDraw = Literal[tuple(TASK_DRAWS)]
LossReduction = Literal[tuple(LOSS_REDUCTIONS)]
SimulatorUpdate = Literal[tuple(SIMULATOR_UPDATES)]
SimulatorReward = Literal[tuple(SIMULATOR_REWARDS)]
Finetune = Literal[FINETUNE]
Dtype = Literal[DTYPES]
ToolFormat = Literal[tuple(TRAINED_TOOL_FORMATS)]
Strings = Annotated[list[StrictStr], Field(strict=True)]

EVAL_DRAW_WINDOW = 16  # eval_draw "training_cursor": the release's get_samples(16)
EvalDraw = Literal[tuple(EVAL_DRAWS)]
HeldoutUsers = Literal[tuple(HELDOUT_USERS)]


@dataclass(config=TABLE)
class NLJudgeSpec:
    """The model that judges tau2 NL assertions (agents/domains/tau2/judge.py), as tau2-bench's
    evaluator_nl_assertions does with an LLM (its default: gpt-4.1-2025-04-14, temperature 0).
    Unset (no endpoint): none; a run whose tasks score NL assertions then refuses to start."""

    endpoint: StrictStr = Field(
        "", description='base URL of an OpenAI-compatible server; "" = no judge'
    )
    model: StrictStr = Field("", description="the served model name")
    api_key_env: StrictStr = Field(
        "", description="the environment variable holding its API key (never the key)"
    )
    provider: ProviderName = Field(
        "auto", description="how requests are shaped for its API (agents/llm/providers.py)"
    )
    temperature: StrictFloat = Field(
        0.0, ge=0, le=2, description="sampling temperature (tau2's judge: 0)"
    )
    max_new_tokens: StrictInt = Field(
        2048, ge=1, description="tokens for the judge's reply (a verdict and reason each)"
    )
    timeout: StrictFloat = Field(120.0, gt=0, description="seconds per judge request")

    @model_validator(mode="after")
    def _rules(self) -> NLJudgeSpec:
        if self.endpoint and not self.model:
            raise refuse("model", self.model, "must name the judge's served model")
        if self.model and not self.endpoint:
            raise refuse("endpoint", self.endpoint, "must name the judge's server")
        return self

    def build(self):
        """The judge (None when unset); the API key is read now, so a missing one stops the
        run before any step."""
        if not self.endpoint:
            return None
        from agents.domains.tau2.judge import LLMJudge

        key = None
        if self.api_key_env:
            key = secret(self.api_key_env)
            if not key:
                raise ConfigError(
                    f"nl_judge: environment variable {self.api_key_env} is not set",
                    "nl_judge.api_key_env",
                )
        return LLMJudge(
            self.endpoint,
            self.model,
            api_key=key,
            provider=self.provider,
            temperature=self.temperature,
            max_tokens=self.max_new_tokens,
            timeout=self.timeout,
        )


@dataclass(config=TABLE)
class ScenarioSpec:
    train_split: StrictStr = Field("train", description="the Domain's split to train on")
    eval_split: StrictStr = Field("test", description="the split the held-out panel is tested on")
    train_ids: Strings = Field(
        default_factory=list, description="explicit scenario ids; [] = the split"
    )
    eval_ids: Strings = Field(
        default_factory=list, description="explicit scenario ids; [] = the split"
    )
    max_train: StrictInt = Field(0, ge=0, description="keep the first N scenarios (0 = all)")
    max_eval: StrictInt = Field(0, ge=0, description="keep the first N scenarios (0 = all)")
    eval_draw: EvalDraw = Field(
        "split",
        description="which tasks each held-out evaluation plays; "
        + " | ".join(f"{k}: {v}" for k, v in EVAL_DRAWS.items()),
    )


Strategy = Literal[DISTRIBUTED_STRATEGIES]


@dataclass(config=TABLE)
class DistributedSpec:
    """How many processes train the run (data-parallel, launched by `accelerate launch`)."""

    processes: StrictInt = Field(
        1,
        ge=1,
        description="training processes (ranks); each rolls out its share of a step's tasks."
        " The TrainingRun's task launches this many; on the command line it is"
        " `accelerate launch --num_processes N`, which wins when they differ",
    )
    strategy: Strategy = Field(
        "ddp",
        description="ddp: every rank holds the whole model, gradients are all-reduced"
        " | fsdp: parameters sharded across ranks, for models that do not fit one device"
        " (LoRA or full fine-tuning; see docs/paper.md)",
    )
    colocated_server_share: StrictFloat = Field(
        0.0,
        ge=0,
        lt=1,
        description="the share of each GPU a vLLM server on the training GPUs holds (its"
        " --gpu-memory-utilization): the dry run counts it in every phase; 0 = the rollout"
        " servers (rollout_endpoint, simulator.endpoint) run on other GPUs",
    )
    # NCCL's own default is 10 minutes (accelerate's too): a collective that one rank enters
    # while another is still working (a long checkpoint write, a slow rollout on one rank)
    # is cut off after this long, and every rank then names the collective that timed out
    timeout: StrictInt = Field(
        1800,
        ge=1,
        le=86400,
        description="seconds a rank waits in a collective for the others before the run fails"
        " with a timeout naming the collective (the process group's timeout; NCCL's default is"
        " 600). The held-out evaluation is split across ranks, so no rank waits out another's"
        " whole panel",
    )
    backend: StrictStr = Field(
        "auto",
        pattern=r"^(auto|[a-z0-9_-]+(:[a-z0-9_-]+)?(,[a-z0-9_-]+:[a-z0-9_-]+)*)$",
        description='the process group\'s backend: "auto" is "cpu:gloo,cuda:nccl" on GPUs (NCCL'
        " for the model's tensors, gloo beside it for anything on the CPU) and gloo on CPU;"
        ' or torch\'s own spelling ("nccl", "cpu:gloo,cuda:nccl"). With one the run\'s'
        " device type has no backend in (a cuda-only group on a CPU run, as CI's NCCL"
        " stand-in), the run's collectives go through a gloo group of their own",
    )


@dataclass(config=TABLE)
class LoraSpec:
    r: StrictInt = Field(8, ge=1, description="LoRA rank")
    # LoRA's best learning rate is about 10x full fine-tuning's (Schulman et al. 2025, "LoRA
    # Without Regret"; TRL's guide of that name says the same), so a recipe tuned for full
    # fine-tuning (the paper's 1e-6) moves an adapter about 10x less unless it is scaled.
    lr_scale: StrictFloat = Field(
        1.0,
        gt=0,
        le=1000,
        description='finetune = "lora": the optimizer\'s learning rate is lr x lr_scale (and the'
        " co-trained simulator's simulator_lr x lr_scale); about 10 gives a full-fine-tuning"
        ' rate\'s effect ("LoRA Without Regret"). Ignored under finetune = "full"',
    )
    alpha: StrictInt = Field(16, gt=0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: StrictFloat = Field(0.0, ge=0, lt=1, description="dropout on the LoRA input")
    targets: Strings = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="the modules that get an adapter",
    )


@dataclass(config=TABLE)
class CollapseSpec:
    """When a step's diversity measures (training/measures/diversity.py) warn of collapse; the defaults are
    justified in docs/training.md ("Collapse warnings"). A bound of 0 (a `max_`: 1) never
    warns."""

    min_sim_distinct_2: StrictFloat = Field(
        0.3, ge=0, le=1, description="warn when the simulator's distinct-2 over a step falls below"
    )
    max_sim_top_opening_share: StrictFloat = Field(
        0.5,
        ge=0,
        le=1,
        description="warn when more than this share of a step's conversations open with the same"
        " user reply",
    )
    min_agent_entropy: StrictFloat = Field(
        0.05, ge=0, description="warn when the agent's token entropy (nats/token) falls below"
    )
    embedding_model: StrictStr = Field(
        "",
        description='a local sentence-embedding model folder for sim/embedding_dispersion; ""'
        " = not measured (nothing is downloaded)",
    )
    min_sim_dispersion: StrictFloat = Field(
        0.0,
        ge=0,
        le=2,
        description="with embedding_model: warn when the user turns' mean pairwise cosine"
        " distance falls below (0 = never; calibrate per embedding model)",
    )


def _behaviour_reference(value: str) -> str:
    kind, _, where = value.partition(":")
    if value and value != "p4g_corpus" and not (kind in ("run", "texts") and where.strip()):
        raise PydanticCustomError(
            "behaviour_reference",
            'must be "", "p4g_corpus", "run:<folder>" or "texts:<file>" (got {value!r})',
            {"value": value},
        )
    return value


BehaviourReference = Annotated[StrictStr, AfterValidator(_behaviour_reference)]


@dataclass(config=TABLE)
class BehaviourSpec:
    """COLLAPSE-AWARE's behaviour profiles (training/measures/profiles.py): one behaviour space
    fit at the run's start on a named reference and saved in <run>/behaviour_space/, the
    simulators' MCI, SCD and BDI every step on a fixed probe set and pooled, PSOD at
    evaluation steps (docs/training.md, "Behaviour profiles"). Off unless `reference` is set
    (or `decisions_only`)."""

    reference: BehaviourReference = Field(
        "",
        description='the reference the clusters are fit on: "p4g_corpus" (the official corpus\'s'
        ' human persuadee turns), "run:<folder>" (a run\'s pooled simulator turns: tau2),'
        ' "texts:<file>" (one JSON string a line: a study\'s participants\' turns); "" = none',
    )
    decisions_only: StrictBool = Field(
        False,
        description="without a reference: measure the choice turns alone (exact, from the"
        " decision probabilities), no embedding, no clusters",
    )
    corpus: StrictStr = Field(
        "",
        description='p4g_corpus: the folder holding full_dialog.csv ("" = domain_data, else the'
        " shared reference data's p4g/); nothing is downloaded",
    )
    embedder: StrictStr = Field(
        "",
        description="a local model folder whose mean-pooled last hidden states embed the turns"
        ' (a sentence-embedding model or a causal LM; "" = the run\'s base model)',
    )
    clusters: StrictInt = Field(20, ge=2, le=1000, description="K, the k-means clusters")
    reference_max: StrictInt = Field(
        2000,
        ge=10,
        le=200_000,
        description="at most this many reference turns (and labelled sentences) are embedded,"
        " a seeded draw: the fit's cost at the run's start",
    )
    dialogue_acts: StrictBool = Field(
        True,
        description="p4g_corpus: also train a dialogue-act classifier on the annotated persuadee"
        " sentences (300_dialog.xlsx) and measure in its human-defined categories",
    )
    support_share: StrictFloat = Field(
        0.005,
        ge=0,
        lt=1,
        description="a cluster is in the people's support when it holds at least this share of"
        " the reference (0.005 = the release's 5 samples of 1,000)",
    )
    cover_share: StrictFloat = Field(
        0.01,
        ge=0,
        lt=1,
        description="a simulator covers a cluster when more than 0 and at least this share of"
        " its behaviour falls in it (on a choice turn, of its probability: the SmolLM2"
        " persuadee's 0.3% on $0 is not behaviour a run meets)",
    )
    probe_tasks: StrictInt = Field(
        2,
        ge=1,
        le=64,
        description="the fixed probe set's training tasks (each with every opening the Domain"
        " fixes): the per-step cost",
    )
    probe_samples: StrictInt = Field(
        2, ge=1, le=32, description="replies per probe (the same seeds every step)"
    )
    probe_opening: StrictStr = Field(
        "",
        description="the agent's opening on a probe where the agent speaks first and the Domain"
        ' fixes no asks ("" = a plain greeting)',
    )
    bootstrap: StrictInt = Field(
        200,
        ge=0,
        le=10_000,
        description="bootstrap draws for the estimates' 90% intervals (0 = none)",
    )
    psod_base_tasks: StrictInt = Field(
        2,
        ge=0,
        le=64,
        description="co-training: at evaluation steps the agent also plays the frozen base"
        " simulator on this many held-out tasks (group_size each) for psod/base (0 = not"
        " measured)",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.reference) or self.decisions_only

    def space_settings(self, seed: int, embedder: str) -> dict[str, Any]:
        """What defines the run's behaviour space (a resume must find the same)."""
        return {
            "reference": self.reference,
            "embedder": embedder,
            "clusters": self.clusters,
            "reference_max": self.reference_max,
            "seed": seed,
            "dialogue_acts": self.dialogue_acts and self.reference == "p4g_corpus",
        }


CurationGate = Literal[tuple(CURATION_GATES)]


@dataclass(config=TABLE)
class CurationSpec:
    """COLLAPSE-AWARE's curation of the agent's training data (training/measures/curation.py):
    a quality gate on the simulator's side of each rollout, then diversity weights
    w = (1 / MCI of its simulator) * exp(-alpha * density of its simulator turns) and, with
    mode_balance, an equal share of the batch for each behaviour cluster present, applied as
    per-sequence loss weights (mean 1 over the kept rollouts, the advantages untouched). Off
    by default: without it a step is exactly today's."""

    enabled: StrictBool = Field(False, description="curate the agent's update (opt-in)")
    gate: list[CurationGate] = Field(
        default_factory=lambda: list(CURATION_GATES),
        description="what drops a rollout from the update before any weighting: "
        + "; ".join(f'"{k}": {v}' for k, v in CURATION_GATES.items())
        + " ([] = no gate)",
    )
    diversity: StrictBool = Field(
        True,
        description="weigh each kept rollout by 1/MCI of its simulator times exp(-alpha x its"
        " kernel density among the step's rollouts), in the run's behaviour space (needs"
        " behaviour.reference)",
    )
    alpha: StrictFloat = Field(
        1.0,
        ge=0,
        le=50,
        description="how strongly a rollout in a crowded region of the behaviour space is"
        " down-weighted: exp(-alpha x density), density in [0, 1] (0 = the density is ignored)",
    )
    bandwidth: StrictFloat = Field(
        0.0,
        ge=0,
        le=4,
        description="the Gaussian kernel's width h on the unit-length behaviour vectors"
        " (distances lie in [0, 2]); 0 = the median distance between the step's rollouts",
    )
    mode_balance: StrictBool = Field(
        False,
        description="give each behaviour cluster present among the step's kept rollouts an"
        " equal share of the batch's weight (needs behaviour.reference and 2 clusters present;"
        " parley trains on every rollout it plays, so balancing re-weights, never resamples)",
    )
    min_weight: StrictFloat = Field(
        0.0,
        ge=0,
        le=1,
        description="a kept rollout's weight is clipped to at least this after the mean-1"
        " normalisation (then normalised once more)",
    )
    max_weight: StrictFloat = Field(
        5.0,
        ge=1,
        le=100,
        description="a kept rollout's weight is clipped to at most this after the mean-1"
        " normalisation (then normalised once more): bounds the variance one rollout adds",
    )

    @model_validator(mode="after")
    def _rules(self) -> CurationSpec:
        if len(set(self.gate)) != len(self.gate):
            raise refuse("gate", self.gate, "names a reason twice")
        if self.enabled and not (self.gate or self.diversity or self.mode_balance):
            raise refuse(
                "enabled",
                True,
                "with no gate, diversity = false and mode_balance = false"
                " curates nothing: set one, or leave [curation] off",
            )
        return self

    @property
    def weighs(self) -> bool:
        """Whether the weights are measured in the behaviour space (needs [behaviour])."""
        return self.enabled and (self.diversity or self.mode_balance)


def _breaker_measures(names: list[str]) -> list[str]:
    for name in names:
        if name not in ("scd", "psod") and "/" not in name:
            raise PydanticCustomError(
                "breaker_measure",
                'each must be "scd" (every behaviour/<space>/probe/scd), "psod" (psod/training)'
                " or a metrics.jsonl key such as psod/current, not {name}",
                {"name": repr(name)},
            )
    return names


BreakerMeasures = Annotated[list[StrictStr], Field(strict=True), AfterValidator(_breaker_measures)]


@dataclass(config=TABLE)
class BreakerSpec:
    """COLLAPSE-AWARE's two-level breaker (training/measures/breaker.py): each measure's
    thresholds are quantiles of its own values over the run's first `warmup` steps, never
    constants; yellow raises the synthesis share, red stops the run with a resumable checkpoint
    and the resumed run re-diversifies the simulators (docs/training.md, "The breaker"). Every
    measure is one where higher is worse. Needs [behaviour]."""

    enabled: StrictBool = Field(False, description="judge every step (off: nothing is judged)")
    measures: BreakerMeasures = Field(
        default_factory=lambda: ["scd", "psod"],
        min_length=1,
        description='what is judged: "scd" (the probe-set SCD of every behaviour space the run'
        ' has), "psod" (psod/training, at evaluation steps) or metrics.jsonl keys; higher is worse',
    )
    warmup: StrictInt = Field(
        8,
        ge=2,
        le=100_000,
        description="N: each measure's values in the first N steps fit its thresholds; the"
        " breaker judges from step N + 1",
    )
    yellow_quantile: StrictFloat = Field(
        0.9,
        gt=0,
        le=1,
        description="yellow when a measure is above this quantile of its warmup values",
    )
    red_quantile: StrictFloat = Field(
        1.0,
        gt=0,
        le=1,
        description="red when a measure is above this quantile of its warmup values plus"
        " red_margin x their range (at least yellow_quantile)",
    )
    red_margin: StrictFloat = Field(
        1.0,
        ge=0,
        le=100,
        description="how far past red_quantile red starts, in warmup ranges (max - min): with"
        " the defaults red is a rise past the warmup's maximum by its whole spread again",
    )
    red_after: StrictInt = Field(
        0,
        ge=0,
        le=100_000,
        description="yellow this many steps in a row turns red (the raised synthesis did not"
        " help); 0 = only the red threshold does",
    )
    yellow_step: StrictFloat = Field(
        0.1,
        gt=0,
        le=1,
        description="entering yellow raises the synthesis share by this much (at most 1);"
        " back to green takes it away again",
    )
    recover_steps: StrictInt = Field(
        3,
        ge=1,
        le=100_000,
        description="M: a level is left downwards (red to yellow, yellow to green) after M"
        " steps in a row below its threshold",
    )
    red_stops: StrictBool = Field(
        True,
        description="red stops training with a resumable checkpoint, and the resumed run"
        " re-diversifies; false: red re-diversifies at once and training goes on",
    )

    @model_validator(mode="after")
    def _order(self) -> BreakerSpec:
        if self.red_quantile < self.yellow_quantile:
            raise refuse(
                "red_quantile",
                self.red_quantile,
                f"must be at least yellow_quantile ({self.yellow_quantile}): red is past yellow",
            )
        return self

    def judges_psod(self) -> bool:
        return any(m == "psod" or m.startswith("psod/") for m in self.measures)


@dataclass(config=TABLE)
class SynthesisSpec:
    """COLLAPSE-AWARE's anti-collapse synthesis (training/regimes/synthesis.py): simulator
    supplies that play a share of each step's tasks beside the regime's own simulator.
    interpolate: frozen variants whose settings lie between two sources (temperature, top_p,
    a prompt variant mixed in); verbalized_missing: Verbalized Sampling told which behaviour
    clusters the population leaves uncovered (needs [behaviour]); adversarial: a simulator
    co-trained on 1 - the agent's reward. Off unless a supply is on: runs without it are
    today's, draw for draw."""

    share: StrictFloat = Field(
        0.0,
        ge=0,
        le=1,
        description="the share of each step's tasks (a task's whole group) that synthesis"
        " supplies play; the breaker raises it at run time (regime.synthesis_share); 0 with a"
        " supply on: built, probed for nothing, and played only once the share is raised",
    )
    interpolate: StrictBool = Field(
        False, description="supply: frozen variants between the two sources' settings"
    )
    verbalized_missing: StrictBool = Field(
        False,
        description="supply: Verbalized Sampling whose prompt shows the reference's turns"
        " nearest the clusters the population covers least (needs behaviour.reference)",
    )
    adversarial: StrictBool = Field(
        False,
        description="supply: a simulator co-trained on 1 - the agent's reward (the co-training"
        " update, its own LoRA on simulator.model, sim learning rate and simulator_beta)",
    )
    from_temperature: StrictFloat = Field(
        0.3, gt=0, le=5, description="interpolate: the first source's temperature"
    )
    to_temperature: StrictFloat = Field(
        1.3, gt=0, le=5, description="interpolate: the second source's temperature"
    )
    from_top_p: StrictFloat = Field(
        1.0,
        gt=0,
        le=1,
        description="interpolate: the first source's top_p (an endpoint simulator's: in-process"
        " sampling uses temperature alone)",
    )
    to_top_p: StrictFloat = Field(
        1.0, gt=0, le=1, description="interpolate: the second source's top_p (endpoint only)"
    )
    from_persona: StrictStr = Field(
        "", description="interpolate: the first source's prompt variant (persona text)"
    )
    to_persona: StrictStr = Field(
        "", description="interpolate: the second source's prompt variant (persona text)"
    )
    variants: StrictInt = Field(
        3,
        ge=1,
        le=16,
        description="interpolate: the variants strictly between the sources, at lambda ="
        " i / (variants + 1); variant i plays the second source's prompt in round(lambda x G)"
        " of its group's G rollouts",
    )
    missing_clusters: StrictInt = Field(
        3,
        ge=1,
        le=50,
        description="verbalized_missing: how many under-covered clusters the prompt shows"
        " (largest reference share minus population share first)",
    )
    exemplars: StrictInt = Field(
        2,
        ge=1,
        le=5,
        description="verbalized_missing: the reference's turns shown per missing cluster"
        " (those nearest its centroid)",
    )
    rediversify_steps: StrictInt = Field(
        4,
        ge=1,
        le=1000,
        description="regime.rediversify() (the breaker, on resuming after a red stop): steps"
        " played at share 1.0 before the share returns to what it was",
    )

    @property
    def enabled(self) -> bool:
        return self.interpolate or self.verbalized_missing or self.adversarial

    def supplies(self) -> list[str]:
        """The supplies on, in a fixed order (the order synthesis tasks cycle through)."""
        return [n for n in ("interpolate", "verbalized_missing", "adversarial") if getattr(self, n)]


# the GRPO block's own types (the estimators' formulas: grpo.KL_ESTIMATORS)
KlEstimator = Literal[KL_ESTIMATOR_NAMES]


def _betas(betas: list[float]) -> list[float]:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise PydanticCustomError("betas", "must be two numbers [b1, b2], each in [0, 1)")
    return betas


AdamBetas = Annotated[list[StrictFloat], Field(strict=True), AfterValidator(_betas)]


@dataclass(config=TABLE)
class RunConfig:
    name: Name = Field(description="the run's name (its output folder, its checkpoints' prefix)")
    domain: DomainName = Field(description="the task family (agents.domains)")
    regime: RegimeName = Field(
        Regime.SINGLE.value,
        description="which simulator the agent meets, and whether it learns too",
    )
    domain_data: StrictStr = Field(
        "",
        description='official data folder for the Domain ("" = its bundled data); a path that is'
        " absent stops the run, never falling back to the bundled data",
    )
    domain_protocol: StrictStr = Field(
        "",
        description='which of the Domain\'s protocols the task runs ("" = its default; P4G:'
        ' "parley", the honest persuader of the studies, or "release", the paper\'s released'
        " task, which needs domain_data: agents/domains/p4g/release.py)",
    )
    tau2_version: StrictStr = Field(
        "",
        description='tau2 retail/airline: the tau2-bench task version, "v0.2.0" or "v1.0.0" (""'
        " = v0.2.0, the version the paper's release most likely scored:"
        " agents/domains/tau2/versions.py); task files of the other version are refused",
    )
    nl_judge: NLJudgeSpec = Field(
        default_factory=NLJudgeSpec,
        description="tau2: the model that judges NL assertions; required when the tasks' reward"
        " basis includes NL_ASSERTION (v1.0.0 retail), which is never counted without one",
    )
    base_model: StrictStr = Field(
        "", description='a Hugging Face model folder; "" = agents.paths.base_model_dir()'
    )
    tasks: ScenarioSpec = Field(
        default_factory=ScenarioSpec,
        description="which scenarios (the TOML table keeps tau2's word, [tasks])",
    )
    simulator: SimulatorSpec = Field(
        default_factory=SimulatorSpec, description="the simulator the agent trains against"
    )
    ensemble: list[SimulatorSpec] = Field(
        default_factory=list,
        description='regime "ensemble": the K >= 2 frozen simulators the agent trains against'
        " (then `simulator` is left unset)",
    )
    ensemble_draw: EnsembleDraw = Field(
        "rollout",
        description='regime "ensemble": which member plays a rollout\'s user: '
        + " | ".join(f"{k}: {v}" for k, v in ENSEMBLE_DRAWS.items())
        + ' (with task_draw = "release" the member is the task\'s position mod K instead)',
    )
    task_draw: TaskDraw = Field(
        "split",
        description="which tasks a step plays: "
        + " | ".join(f"{k}: {v}" for k, v in TASK_DRAWS.items()),
    )
    heldout: list[SimulatorSpec] = Field(
        default_factory=list, description="the held-out panel: users the agent never trains on"
    )
    heldout_users: HeldoutUsers = Field(
        "like_training",
        description="regimes persona and verbalized: the panel's users; "
        + " | ".join(f"{k}: {v}" for k, v in HELDOUT_USERS.items()),
    )
    # GRPO
    group_size: StrictInt = Field(
        4, ge=2, description="G rollouts per task (GRPO compares within a group)"
    )
    batch_tasks: StrictInt = Field(1, ge=1, description="tasks per step")
    steps: StrictInt = Field(
        10,
        ge=0,
        description="optimizer steps; 0 = a base evaluation: the starting policy on the held-out"
        " panel, then stop (the paper's Base rows)",
    )
    lr: StrictFloat = Field(1e-5, gt=0, description="the agent's learning rate")
    simulator_lr: StrictFloat = Field(
        0.0, ge=0, description="the co-trained simulator's learning rate (0 = lr)"
    )
    simulator_beta: StrictFloat = Field(
        0.1,
        ge=0,
        description="co-trained simulator's KL weight (kl_estimator) to its own base model",
    )
    simulator_update: SimulatorUpdate = Field(
        "sampled",
        description="how a co-trained simulator learns each step: "
        + " | ".join(f"{k}: {v}" for k, v in SIMULATOR_UPDATES.items()),
    )
    eps: StrictFloat = Field(0.2, gt=0, lt=1, description="clip range of the ratio")
    eps_high: StrictFloat = Field(
        0.0, ge=0, description="upper clip range (0 = eps, symmetric clipping)"
    )
    beta: StrictFloat = Field(
        0.0,
        ge=0,
        description="the agent's KL weight to its starting model; 0 skips the reference model"
        " (Population Self-Play as released: no agent KL)",
    )
    # the release's launchers: --kl-loss-type low_var_kl, which is k3 (CHATS-lab/scope_usim
    # cmd/slime/p4g/rl_single_gpt5mini.sh @1470e27); the formulas are in grpo.grpo_loss
    loss_reduction: LossReduction = Field(
        "token",
        description="how the step's per-token losses are averaged, for the agent and a"
        " co-trained simulator: " + " | ".join(f"{k}: {v}" for k, v in LOSS_REDUCTIONS.items()),
    )
    kl_estimator: KlEstimator = Field(
        "k3",
        description="the per-token KL estimator, d = log pi_ref - log pi: k1 = -d (the log"
        " ratio) | k2 = d^2 / 2 | k3 = exp(d) - d - 1 (low variance, >= 0; the release's"
        " low_var_kl); for the agent (beta) and a co-trained simulator (simulator_beta)",
    )
    kl_clamp: StrictFloat = Field(
        0.0,
        ge=0,
        description="each token's KL estimate clamped to [-kl_clamp, kl_clamp] before beta weighs"
        " it (agent and co-trained simulator); 0 = unclamped (TRL); the release's Slime clamps"
        " low_var_kl (k3) at 10",
    )
    adam_betas: AdamBetas = Field(
        default_factory=lambda: [0.9, 0.999],
        description="AdamW's (b1, b2) for the agent and a co-trained simulator; the release"
        " uses [0.9, 0.98]",
    )
    scale_std: StrictBool = Field(
        True, description="advantages (r - mean) / (std + 1e-4); false: r - mean"
    )
    center_rewards: StrictBool = Field(
        True,
        description="advantages relative to the task's group (r - mean, see scale_std); false:"
        " the raw reward r is the advantage, as Slime's --disable-rewards-normalization in every"
        " launcher of the paper's release (needs scale_std = false)",
    )
    ppo_epochs: StrictInt = Field(1, ge=1, description="passes over each step's rollouts")
    micro_batch: StrictInt = Field(2, ge=1, description="sequences per forward pass")
    gradient_checkpointing: StrictBool = Field(
        False,
        description="recompute each layer's activations in the update's backward pass instead"
        " of keeping them: far less memory for long conversations (the dry run then checks its"
        " figure with checkpointing on), about a third more update time",
    )
    grad_clip: StrictFloat = Field(1.0, ge=0, description="gradient norm clip (0 = no clipping)")
    weight_decay: StrictFloat = Field(
        0.0, ge=0, description="AdamW weight decay (agent and co-trained simulator)"
    )
    weight_decay_skip_1d: StrictBool = Field(
        False,
        description="biases and 1-D parameters (norm weights) take no weight decay, as"
        " Megatron's optimizer groups them (the release); false: every trained parameter"
        " decays. Under LoRA every trained matrix is 2-D: no effect",
    )
    # rollouts
    temperature: StrictFloat = Field(0.7, gt=0, description="the agent's sampling temperature")
    max_new_tokens: StrictInt = Field(48, ge=1, description="tokens per agent turn")
    max_turns: StrictInt = Field(
        MAX_TURNS,
        ge=1,
        description="user + agent messages; also capped by the Domain's own max_turns",
    )
    max_tool_rounds: StrictInt = Field(
        MAX_TOOL_ROUNDS,
        ge=1,
        description="consecutive tool-call turns of the agent before the turn is cut",
    )
    rollouts_at_once: StrictInt = Field(
        0,
        ge=0,
        le=4096,
        description="conversations a rank plays at once (a task's group in parts of this size,"
        " one part after the other): bounds the rollout phase's memory, every open transcript's"
        " KV cache (the dry run counts this many); 0 = the whole group (group_size)",
    )
    tool_format: ToolFormat = Field(
        "auto",
        description="how the agent writes tool calls, trained and served alike: "
        + "; ".join(f"{name}: {what}" for name, what in TRAINED_TOOL_FORMATS.items()),
    )
    rollout_endpoint: StrictStr = Field(
        "",
        description='vLLM base URL for the agent\'s rollouts; "" = in-process. LoRA: the server'
        " hot-loads the adapter before each step (start it with runtime LoRA); full fine-tuning:"
        " the trainer pushes its weights into the served model through vLLM's weight-transfer"
        ' API (start it with weight_transfer = "nccl" on GPUs, "parley_shm" on CPU)',
    )
    weight_sync_backend: Literal[WEIGHT_SYNC_BACKENDS] = Field(
        "auto",
        description="full fine-tuning with a served role: how the trainer's weights reach the"
        ' vLLM server after each step (its --weight-transfer-config). "auto": "nccl" from a'
        ' GPU (the server on other GPUs), "parley_shm" from the CPU (shared memory, one host);'
        ' "ipc": CUDA IPC, the server on the trainer\'s own GPU (one trainer process)',
    )
    weight_sync_host: StrictStr = Field(
        "127.0.0.1",
        min_length=1,
        description="full fine-tuning on GPUs with a served role: the address of this trainer"
        " that the vLLM server's workers reach for NCCL's rendezvous (vLLM's weight-transfer"
        " engine; the trainer is rank 0 of that group). 127.0.0.1 when vLLM runs on the"
        " same node",
    )
    # population co-training
    pool_size: StrictInt = Field(10, ge=1, description="simulator snapshots kept (FIFO)")
    pool_every: StrictInt = Field(16, ge=1, description="steps between snapshots")
    simulator_reward: SimulatorReward = Field(
        "auto",
        description="a co-trained simulator's reward; "
        + "; ".join(f"{name}: {text}" for name, text in SIMULATOR_REWARDS.items()),
    )
    # evaluation and checkpoints
    eval_every: StrictInt = Field(
        0, ge=0, description="steps between evaluations (0 = only after the last step)"
    )
    eval_at_end: StrictBool = Field(
        True,
        description="evaluate after the last step too, whatever eval_every; false: only at"
        " multiples of eval_every (needs eval_every > 0), as the release's Slime, which"
        " evaluates after steps 16, 32, ... 992 of 1000 and not after the last",
    )
    eval_samples: StrictInt = Field(
        1, ge=1, description="conversations per held-out task and simulator"
    )
    save_every: StrictInt = Field(
        0, ge=0, description="steps between checkpoints (0 = only after the last step)"
    )
    keep_checkpoints: StrictInt = Field(
        0,
        ge=0,
        description="checkpoints kept: the last N, plus the best by keep_best_by (0 = every"
        " one, as the release: about 1.5 TB for a 1000-step Qwen3-4B run saved every 32 steps)",
    )
    keep_best_by: Literal["heldout/success", "heldout/reward"] = Field(
        "heldout/success",
        description="keep_checkpoints > 0: the held-out figure (the checkpoint's step's"
        " evaluation, whole-panel mean) whose best checkpoint is kept beside the last N",
    )
    # model
    finetune: Finetune = Field(
        "lora",
        description="lora: train an adapter | full: every weight. Applies to every model that"
        " learns: the agent and a co-trained simulator",
    )
    lora: LoraSpec = Field(default_factory=LoraSpec, description="the adapter")
    distributed: DistributedSpec = Field(
        default_factory=DistributedSpec,
        description="data-parallel training: processes and ddp | fsdp (default: one process)",
    )
    collapse: CollapseSpec = Field(
        default_factory=CollapseSpec,
        description="collapse diagnostics: embedding model and the warning thresholds",
    )
    behaviour: BehaviourSpec = Field(
        default_factory=BehaviourSpec,
        description="COLLAPSE-AWARE behaviour profiles: MCI, SCD, BDI every step, PSOD at"
        " evaluation steps (off unless behaviour.reference is set)",
    )
    curation: CurationSpec = Field(
        default_factory=CurationSpec,
        description="COLLAPSE-AWARE curation of the agent's update: quality gate, diversity"
        " weights, mode-balanced batches (off unless curation.enabled)",
    )
    breaker: BreakerSpec = Field(
        default_factory=BreakerSpec,
        description="COLLAPSE-AWARE's breaker: yellow raises the synthesis share, red stops the"
        " run to re-diversify (thresholds: quantiles of the first steps; needs [behaviour])",
    )
    synthesis: SynthesisSpec = Field(
        default_factory=SynthesisSpec,
        description="COLLAPSE-AWARE anti-collapse synthesis supplies: interpolated variants,"
        " Verbalized Sampling told the missing clusters, an adversarial co-trained simulator"
        " (off unless a supply is on)",
    )
    dtype: Dtype = Field("float32", description="weights' dtype")
    mixed_precision: StrictBool = Field(
        False,
        description="keep every trained model's weights, gradients and AdamW state in float32"
        " (master weights) and run its forward/backward passes in `dtype` (bfloat16/float16:"
        " autocast in one process, FSDP's MixedPrecision when sharded), as Megatron (the"
        " release's stack) does; needed for full fine-tuning at learning rates near 1e-6, whose"
        " steps round away in 16-bit weights. Frozen models (in-process simulators, held-out"
        " users, a full fine-tuning reference copy) stay in `dtype`. Checkpoints hold the float32"
        ' weights (resume is exact). With dtype = "float32" there is nothing to mix: a no-op',
    )
    device: StrictStr = Field("cpu", description="torch device")
    threads: StrictInt = Field(
        0,
        ge=0,
        description="torch CPU threads; 0 = torch's default. 1 is far faster on a busy machine",
    )
    seed: StrictInt = Field(0, description="seeds sampling, draws and initialisation")
    output_dir: StrictStr = Field(
        "", description='"" = <data dir>/runs/<name>; relative paths are under the data dir'
    )

    @model_validator(mode="after")
    def _rules(self) -> RunConfig:
        if not self.eval_at_end and self.eval_every == 0 and self.steps > 0 and self.heldout:
            raise refuse(
                "eval_at_end",
                False,
                "with eval_every = 0 leaves the held-out panel never evaluated: set eval_every",
            )
        self._supply_rules()
        self._task_rules()
        if self.curation.weighs and not self.behaviour.reference:
            raise refuse(
                "curation.diversity" if self.curation.diversity else "curation.mode_balance",
                True,
                "weighs rollouts in the run's behaviour space: set behaviour.reference (or"
                " curate with the gate alone: diversity = false, mode_balance = false)",
            )
        self._breaker_rules()
        self._synthesis_rules()
        base = self.base_model_path()
        if self.trains_simulator:  # learnt in this process, on an endpoint or not
            training = [("local", str(self.simulator_model_path().expanduser().resolve()))]
        else:
            training = [spec.weights(base) for spec in self.training_simulators()]
        for key, spec in [("simulator", self.simulator)] + [
            (f"ensemble[{i}]", s) for i, s in enumerate(self.ensemble)
        ]:
            if spec.seen:
                raise refuse(f"{key}.seen", True, "is for [[heldout]] members only")
        for i, spec in enumerate(self.heldout):
            weights = spec.weights(base)
            if spec.seen:
                if weights is None or weights not in training:
                    raise refuse(
                        f"heldout[{i}].seen",
                        True,
                        "marks a panel member that is a training simulator (the same model on"
                        " the same endpoint); this one is not: remove `seen`",
                    )
                continue
            if weights is not None and weights in training:
                raise refuse(
                    f"heldout[{i}]",
                    spec.name,
                    f"runs on the training simulator's weights ({weights[-1]}): a held-out user"
                    " must share no weights with a simulator the agent trains against (another"
                    ' model, an endpoint serving one, or kind = "scripted")',
                )
        names = [s.name for s in self.heldout]
        if len(set(names)) != len(names):
            raise refuse("heldout", names, "need distinct names")
        served_simulator = self.trains_simulator and self.simulator.endpoint
        if served_simulator and self.finetune == "full":
            if self.regime == Regime.POPULATION:
                raise refuse(
                    "simulator.endpoint",
                    self.simulator.endpoint,
                    'must be empty with regime = "population" and finetune = "full": each pool'
                    " snapshot's turns would need its whole weights pushed into the server and"
                    " the current ones pushed back (LoRA loads a snapshot's adapter beside them)",
                )
            if self.simulator.endpoint.rstrip("/") == self.rollout_endpoint.rstrip("/"):
                raise refuse(
                    "simulator.endpoint",
                    self.simulator.endpoint,
                    "is rollout_endpoint too: under full fine-tuning the agent and the simulator"
                    " each push their own weights into their server's one model, so each needs"
                    " its own server",
                )
        if self.task_draw == "release" and self.domain in ("p4g", "cooperbench"):
            raise refuse(
                "task_draw",
                self.task_draw,
                "reproduces the release's tau2 data source: its P4G and CooperBench sources read"
                ' their files in order (use "split")',
            )
        if self.trains_simulator and self.simulator.sampling != "sent":
            raise refuse(
                "simulator.sampling",
                self.simulator.sampling,
                'must be "sent": a co-trained simulator samples at its own temperature',
            )
        if self.simulator_update == "exact":
            self._check_exact_update()
        if not self.center_rewards and self.scale_std:
            raise refuse(
                "scale_std",
                self.scale_std,
                "must be false with center_rewards = false (raw rewards are not std-scaled)",
            )
        kind = self.simulator.kind
        required = Regime(self.regime).simulator_kind  # the registry decides, not each caller
        if required and kind != required:
            raise refuse(
                "simulator.kind", kind, f'must be "{required}" for regime = "{self.regime}"'
            )
        if self.trains_simulator and kind != SimulatorKind.PLAIN:
            raise refuse(
                "simulator.kind",
                kind,
                f'must be "plain": regime "{self.regime}" trains the simulator in-process',
            )
        if self.trains_simulator and self.simulator.endpoint:
            if self.simulator.adapter:
                raise refuse(
                    "simulator.adapter",
                    self.simulator.adapter,
                    f'must be empty: regime "{self.regime}" trains its own adapter on'
                    " simulator.model",
                )
            for i, spec in enumerate(self.heldout):
                if spec.endpoint.rstrip("/") == self.simulator.endpoint.rstrip("/"):
                    raise refuse(
                        f"heldout[{i}].endpoint",
                        spec.endpoint,
                        "is the co-trained simulator's server, which serves its base model: a"
                        " held-out user must share no weights with it",
                    )
        return self

    def _breaker_rules(self) -> None:
        """The breaker judges COLLAPSE-AWARE's measures, which [behaviour] writes; PSOD only at
        evaluation steps, so the warmup must hold at least one."""
        b = self.breaker
        if not b.enabled:
            return
        if not self.behaviour.enabled:
            raise refuse(
                "breaker.enabled",
                True,
                "needs [behaviour] (reference or decisions_only): the breaker judges the"
                " behaviour measures it writes",
            )
        if b.judges_psod() and not self.heldout:
            raise refuse(
                "breaker.measures",
                b.measures,
                "judge PSOD, which needs a held-out panel ([[heldout]]): add one or leave psod out",
            )
        if b.judges_psod() and not 0 < self.eval_every <= b.warmup:
            raise refuse(
                "breaker.warmup",
                b.warmup,
                f"holds no evaluation step (eval_every = {self.eval_every}), so PSOD would have"
                " no warmup values to fit its thresholds on: set eval_every <= warmup",
            )

    def _task_rules(self) -> None:
        """The Domain's protocol exists (and has the data it needs); the release's evaluation
        draw runs over the training tasks."""
        if self.domain_protocol:
            cls = domain_class(self.domain)
            if self.domain_protocol not in cls.protocols:
                raise refuse(
                    "domain_protocol",
                    self.domain_protocol,
                    f"must be one of {one_of(cls.protocols)} for domain {self.domain}"
                    if cls.protocols
                    else f"must be empty: domain {self.domain} has one protocol",
                )
            try:  # a Domain refuses a protocol without the data it needs (P4G's release)
                cls(data_dir=self.domain_data or None, protocol=self.domain_protocol)
            except ValueError as error:
                raise refuse("domain_protocol", self.domain_protocol, f"refused: {error}") from None
        if self.domain not in TAU2_DOMAINS and (self.tau2_version or self.nl_judge.endpoint):
            key = "tau2_version" if self.tau2_version else "nl_judge.endpoint"
            raise refuse(
                key, getattr(self, key.split(".")[0]), f"is for tau2 domains, not {self.domain}"
            )
        if self.domain in TAU2_DOMAINS:
            try:
                version = task_version(self.tau2_version)
            except ValueError as error:
                raise refuse("tau2_version", self.tau2_version, f"refused: {error}") from None
            # known without reading the files (the offline dry run): v1.0.0's retail tasks
            # score NL assertions; files that do are checked again where the run starts
            if self.domain in NL_JUDGED.get(version.name, ()) and not self.nl_judge.endpoint:
                raise refuse(
                    "nl_judge.endpoint",
                    "",
                    f"must name a judge: tau2 {version.name} {self.domain} tasks score NL"
                    " assertions (LLM-judged), which are never counted without one; set"
                    ' nl_judge.endpoint and nl_judge.model, or tau2_version = "v0.2.0"',
                )
        tasks = self.tasks
        if tasks.eval_draw == "training_cursor" and (
            tasks.eval_split != tasks.train_split or tasks.eval_ids
        ):
            raise refuse(
                "tasks.eval_draw",
                tasks.eval_draw,
                "draws from the training tasks: set eval_split = train_split and no eval_ids",
            )

    def build_domain(self) -> Domain:
        """The run's Domain: its official data (if any) and protocol; for tau2 its task version
        and NL judge. A tau2 run whose tasks score NL assertions without a judge stops here."""
        if self.domain not in TAU2_DOMAINS:
            return get_domain(self.domain, self.domain_data or None, self.domain_protocol)
        domain = domain_class(self.domain)(
            data_dir=self.domain_data or None,
            nl_judge=self.nl_judge.build(),
            version=self.tau2_version,
        )
        domain.check_judge()  # reads the task files: refuses ones of another version too
        return domain

    def _supply_rules(self) -> None:
        """The Ensemble's members and the Persona-Guided guidelines: each read by its regime
        only, so a table another regime would ignore is refused rather than trained without."""
        if self.regime == Regime.ENSEMBLE:
            if len(self.ensemble) < 2:
                raise refuse(
                    "ensemble",
                    [s.name for s in self.ensemble],
                    'needs K >= 2 [[ensemble]] simulators for regime = "ensemble"',
                )
            names = [s.name for s in self.ensemble]
            if len(set(names)) != len(names):
                raise refuse("ensemble", names, "need distinct names")
            if self.simulator != SimulatorSpec():
                raise refuse(
                    "simulator",
                    self.simulator.name,
                    'must be left unset with regime = "ensemble": the agent trains against the'
                    " [[ensemble]] members (simulator = {} clears a preset's)",
                )
        elif self.ensemble:
            raise refuse(
                "ensemble",
                [s.name for s in self.ensemble],
                f'is read only with regime = "ensemble" (regime is "{self.regime}")',
            )
        others = [(f"ensemble[{i}]", s) for i, s in enumerate(self.ensemble)]
        others += [(f"heldout[{i}]", s) for i, s in enumerate(self.heldout)]
        if self.regime != Regime.PERSONA:
            others.append(("simulator", self.simulator))
        for key, spec in others:
            if spec.guidelines:
                raise refuse(
                    f"{key}.guidelines",
                    spec.guidelines[:40],
                    'is read only for the training simulator with regime = "persona"',
                )
        if self.regime == Regime.PERSONA:
            if self.simulator.kind == SimulatorKind.SCRIPTED:
                raise refuse(
                    "simulator.kind",
                    self.simulator.kind,
                    'must be "plain" or "verbalized" for regime = "persona" (guidelines go in'
                    " a system prompt)",
                )
            if not self.persona_guidelines():
                raise refuse(
                    "simulator.guidelines",
                    "",
                    f'must be set for regime = "persona" on domain {self.domain}: it has no'
                    " default guidelines (the release runs Persona-Guided on tau2 only, P4G's"
                    " tasks already carrying personas)",
                )

    def _synthesis_rules(self) -> None:
        """[synthesis]: each supply's needs, refused at the start rather than met mid-run."""
        syn = self.synthesis
        if not syn.enabled:
            if syn.share > 0:
                raise refuse(
                    "synthesis.share",
                    syn.share,
                    "needs a supply on (interpolate, verbalized_missing or adversarial)",
                )
            return
        if self.distributed.processes > 1:
            raise refuse(
                "synthesis",
                syn.supplies(),
                "runs in one process: a synthesis task's group is"
                " played and learnt on one rank (set distributed.processes = 1)",
            )
        base = self.synthesis_base()
        if (syn.interpolate or syn.verbalized_missing) and base.kind == SimulatorKind.SCRIPTED:
            raise refuse(
                "synthesis",
                syn.supplies(),
                "interpolate and verbalized_missing vary a model"
                f" simulator's settings; the training simulator {base.name!r} is scripted",
            )
        if syn.verbalized_missing and not self.behaviour.reference:
            raise refuse(
                "synthesis.verbalized_missing",
                True,
                "needs [behaviour] reference: the"
                " clusters it is told are missing are the run's behaviour space's",
            )
        if syn.interpolate:
            if not base.endpoint:
                for key in ("from_top_p", "to_top_p"):
                    if getattr(syn, key) != 1.0:
                        raise refuse(
                            f"synthesis.{key}",
                            getattr(syn, key),
                            "is for an endpoint"
                            " simulator (in-process sampling uses temperature alone)",
                        )
            ends = [
                (syn.from_temperature, syn.from_top_p, syn.from_persona),
                (syn.to_temperature, syn.to_top_p, syn.to_persona),
            ]
            if ends[0] == ends[1]:
                raise refuse(
                    "synthesis.interpolate",
                    True,
                    "needs two sources that differ (from_/to_"
                    " temperature, top_p or persona): every variant would be the same",
                )

    def synthesis_base(self) -> SimulatorSpec:
        """The simulator the synthesis supplies vary: the training simulator (an Ensemble's
        first member; a co-trained simulator's frozen base)."""
        return self.training_simulators()[0]

    # -- derived values -------------------------------------------------------------------------

    def persona_guidelines(self) -> str:
        """The Persona-Guided prefix: simulator.guidelines, else the Domain's default (tau2: the
        release's text; agents/domains/tau2/prompts.py)."""
        if self.simulator.guidelines:
            return self.simulator.guidelines
        from agents.domains import domain_class

        return domain_class(self.domain).simulator_guidelines

    def panel_readouts(self) -> dict[str, list[SimulatorSpec]]:
        """The held-out panel's read-outs, by metrics prefix: "heldout" (the panel as
        heldout_users says), and "heldout_plain" (the [[heldout]] tables as written) beside it
        when the first differs from them (training/measures/held_out.py). A scripted member has
        no prompt to prefix and writes no JSON: it stays as it is."""
        plain = list(self.heldout)
        if self.heldout_users != "like_training" or self.regime not in (
            Regime.PERSONA,
            Regime.VERBALIZED,
        ):
            return {"heldout": plain}
        (trained,) = self.training_simulators()
        if self.regime == Regime.PERSONA:
            changes: dict[str, Any] = {"guidelines": trained.guidelines}
        else:
            changes = {"kind": trained.kind, "k": trained.k, "draw": trained.draw}
        like = [
            s if s.kind == SimulatorKind.SCRIPTED else dataclasses.replace(s, **changes)
            for s in plain
        ]
        return {"heldout": like, "heldout_plain": plain} if like != plain else {"heldout": plain}

    def training_simulators(self) -> list[SimulatorSpec]:
        """The simulators the agent trains against, as built: the Ensemble's members, the
        Persona-Guided simulator with its guidelines filled in, else `simulator`."""
        if self.regime == Regime.ENSEMBLE:
            return list(self.ensemble)
        if self.regime == Regime.PERSONA:
            return [dataclasses.replace(self.simulator, guidelines=self.persona_guidelines())]
        return [self.simulator]

    @property
    def clip_high(self) -> float:
        return self.eps_high or self.eps

    @property
    def lr_scale(self) -> float:
        """What the learning rates are multiplied by: lora.lr_scale under LoRA, else 1."""
        return self.lora.lr_scale if self.finetune == "lora" else 1.0

    @property
    def agent_lr(self) -> float:
        """The agent optimizer's learning rate (lr, scaled for LoRA)."""
        return self.lr * self.lr_scale

    @property
    def sim_lr(self) -> float:
        """The co-trained simulator optimizer's learning rate (simulator_lr or lr, scaled for
        LoRA)."""
        return (self.simulator_lr or self.lr) * self.lr_scale

    @property
    def trains_simulator(self) -> bool:
        return Regime(self.regime).trains_simulator

    def _check_exact_update(self) -> None:
        """simulator_update = "exact" only where the simulator's decision is exact and its
        reward is one per decision text (training/regimes/exact_update.py)."""
        from agents.domains import domain_class

        why = None
        if not self.trains_simulator:
            why = f'needs a co-trained simulator; regime "{self.regime}" trains none'
        elif not domain_class(self.domain).exact_user_decision:
            why = (
                f'needs an exact decision distribution: domain "{self.domain}" does not give the'
                " simulator one choice among fixed texts for every ask (p4g-decision does);"
                ' use "sampled"'
            )
        elif self.simulator_reward_mode == "curriculum":
            why = (
                "needs a reward for each decision text; the curriculum reward is one per group"
                ' (use simulator_reward "adversarial" or "cooperative", or "sampled")'
            )
        elif self.distributed.strategy == "fsdp" and self.distributed.processes > 1:
            why = 'is not implemented under FSDP: use distributed.strategy = "ddp"'
        if why:
            raise refuse("simulator_update", self.simulator_update, why)

    @property
    def simulator_reward_mode(self) -> str:
        """simulator_reward with "auto" resolved to the Domain's own."""
        if self.simulator_reward != "auto":
            return self.simulator_reward
        from agents.domains import domain_class

        mode = domain_class(self.domain).simulator_reward
        if mode not in SIMULATOR_REWARDS or mode == "auto":
            raise ConfigError(
                f"simulator_reward auto: domain {self.domain!r} declares {mode!r}, not one of"
                f" {one_of(n for n in SIMULATOR_REWARDS if n != 'auto')}",
                "simulator_reward",
            )
        return mode

    def run_dir(self) -> Path:
        from agents.paths import data_dir

        if not self.output_dir:
            return data_dir() / "runs" / self.name
        path = Path(self.output_dir).expanduser()
        return path if path.is_absolute() else data_dir() / path

    def base_model_path(self) -> Path:
        from agents.paths import base_model_dir

        return Path(self.base_model).expanduser() if self.base_model else base_model_dir()

    def simulator_model_path(self) -> Path:
        """The training simulator's own model folder (a co-trained simulator's base)."""
        model = self.simulator.model
        return Path(model).expanduser() if model else self.base_model_path()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
