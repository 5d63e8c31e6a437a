"""A training run is one RunConfig, loaded from TOML.

    name = "p4g-single-cpu"
    domain = "p4g"
    regime = "single"            # single | verbalized | cotrain | population
    steps = 8
    group_size = 4               # G rollouts per task
    batch_tasks = 1              # tasks per step
    [tasks]    train_split / eval_split / train_ids / eval_ids / max_train / max_eval
    [simulator] the training simulator (see SimulatorSpec)
    [[heldout]] the held-out panel, one table per simulator
    [lora]     r / alpha / dropout / targets  (finetune = "full" trains every weight instead)

Unknown keys and bad values raise ConfigError naming the key, so a typo never trains silently
with a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.simulators.scripted import TYPES as SCRIPTED_TYPES
from agents.simulators.verbalized import MODES as DRAW_MODES

REGIMES = ("single", "verbalized", "cotrain", "population")
SIMULATOR_KINDS = ("plain", "verbalized", "scripted")
SIMULATOR_REWARDS = ("auto", "adversarial", "cooperative")
FINETUNE = ("lora", "full")


class ConfigError(ValueError):
    """A run configuration that cannot be trained."""


@dataclass
class SimulatorSpec:
    """A user simulator. In-process (the base model or `model`, a local HF folder) unless `endpoint`
    names an OpenAI-compatible server, in which case `model` is the served model name. A
    `scripted` simulator is one of the P4G persuadee types of agents/simulators/scripted.py."""

    name: str = "base"
    kind: str = "plain"  # plain | verbalized (k candidates, one drawn) | scripted (`script`)
    model: str = ""  # "" = the run's base model
    endpoint: str = ""  # base URL of an OpenAI-compatible server; "" = in-process
    api_key_env: str = ""  # endpoint: the environment variable holding its API key (never the key)
    script: str = ""  # kind = "scripted": the persuadee type
    adapter: str = ""  # a LoRA adapter folder put on the in-process model
    persona: str = ""  # extra text appended to the simulator's system prompt
    temperature: float = 0.7
    max_new_tokens: int = 64
    k: int = 5
    draw: str = "probability"  # probability | uniform (the "random" VS variant)
    retries: int = 2  # verbalized: re-asks after a malformed reply before using the raw text

    def api_key(self) -> str | None:
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"simulator {self.name!r}: environment variable {self.api_key_env} is not set"
            )
        return key

    def weights(self, base_model: Path) -> tuple[str, ...] | None:
        """What identifies this simulator's weights: the same tuple means the same model."""
        if self.kind == "scripted":
            return None
        if self.endpoint:
            return ("endpoint", self.endpoint.rstrip("/"), self.model)
        model = Path(self.model).expanduser().resolve() if self.model else base_model.resolve()
        return ("local", str(model))


@dataclass
class TaskSpec:
    train_split: str = "train"
    eval_split: str = "test"
    train_ids: list[str] = field(default_factory=list)  # explicit scenario ids; [] = the split
    eval_ids: list[str] = field(default_factory=list)
    max_train: int = 0  # keep the first N scenarios (0 = all)
    max_eval: int = 0


@dataclass
class LoraSpec:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class RunConfig:
    name: str
    domain: str
    regime: str = "single"
    domain_data: str = ""  # official data folder for the Domain ("" = its bundled data)
    base_model: str = ""  # a Hugging Face model folder; "" = agents.paths.base_model_dir()
    tasks: TaskSpec = field(default_factory=TaskSpec)
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    heldout: list[SimulatorSpec] = field(default_factory=list)
    # GRPO
    group_size: int = 4
    batch_tasks: int = 1
    steps: int = 10
    lr: float = 1e-5
    simulator_lr: float = 0.0  # 0 = lr
    simulator_beta: float = 0.1  # co-trained simulator's k3 KL weight to its own base model
    eps: float = 0.2
    eps_high: float = 0.0  # 0 = eps (symmetric clipping)
    beta: float = 0.0  # k3 KL weight; 0 skips the reference model
    scale_std: bool = True  # advantages (r - mean) / (std + 1e-4); False: r - mean
    ppo_epochs: int = 1
    micro_batch: int = 2
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    # rollouts
    temperature: float = 0.7
    max_new_tokens: int = 48
    max_turns: int = 10  # user + agent messages; also capped by the Domain's own max_turns
    max_tool_rounds: int = 4  # consecutive tool-call turns of the agent before the turn is cut
    rollout_endpoint: str = ""  # vLLM base URL for the agent's rollouts; "" = in-process
    # population co-training
    pool_size: int = 10
    pool_every: int = 16
    simulator_reward: str = "auto"  # auto: adversarial (1 - r) for p4g, cooperative (r) otherwise
    # evaluation and checkpoints
    eval_every: int = 0  # 0 = only after the last step
    eval_samples: int = 1  # conversations per held-out task and simulator
    save_every: int = 0  # 0 = only after the last step
    # model
    finetune: str = "lora"
    lora: LoraSpec = field(default_factory=LoraSpec)
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 0  # torch CPU threads; 0 = torch's default. 1 is far faster on a busy machine
    seed: int = 0
    output_dir: str = ""  # "" = <data dir>/runs/<name>; relative paths are under the data dir

    # -- derived values -------------------------------------------------------------------------

    @property
    def clip_high(self) -> float:
        return self.eps_high or self.eps

    @property
    def sim_lr(self) -> float:
        return self.simulator_lr or self.lr

    @property
    def trains_simulator(self) -> bool:
        return self.regime in ("cotrain", "population")

    @property
    def adversarial_simulator(self) -> bool:
        if self.simulator_reward == "auto":
            from agents.domains import domain_class

            try:
                return domain_class(self.domain).user_opposes_agent
            except ValueError:  # a Domain handed to train() directly (tests' toy domains)
                return False
        return self.simulator_reward == "adversarial"

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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return _build(cls, data, "")

    def validate(self) -> RunConfig:
        checks = [
            (bool(self.name.strip()), "name", "must not be empty"),
            (bool(self.domain.strip()), "domain", "must not be empty"),
            (self.regime in REGIMES, "regime", f"must be one of {', '.join(REGIMES)}"),
            (self.finetune in FINETUNE, "finetune", f"must be one of {', '.join(FINETUNE)}"),
            (
                self.simulator_reward in SIMULATOR_REWARDS,
                "simulator_reward",
                f"must be one of {', '.join(SIMULATOR_REWARDS)}",
            ),
            (
                self.group_size >= 2,
                "group_size",
                "must be at least 2 (GRPO compares within a group)",
            ),
            (self.batch_tasks >= 1, "batch_tasks", "must be at least 1"),
            (self.steps >= 1, "steps", "must be at least 1"),
            (self.lr > 0, "lr", "must be positive"),
            (self.simulator_lr >= 0, "simulator_lr", "must be positive (or 0 for lr)"),
            (0 < self.eps < 1, "eps", "must be in (0, 1)"),
            (self.eps_high >= 0, "eps_high", "must be positive (or 0 for eps)"),
            (self.beta >= 0, "beta", "must be >= 0"),
            (self.simulator_beta >= 0, "simulator_beta", "must be >= 0"),
            (self.ppo_epochs >= 1, "ppo_epochs", "must be at least 1"),
            (self.micro_batch >= 1, "micro_batch", "must be at least 1"),
            (self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = no clipping)"),
            (self.temperature > 0, "temperature", "must be positive"),
            (self.max_new_tokens >= 1, "max_new_tokens", "must be at least 1"),
            (self.max_turns >= 1, "max_turns", "must be at least 1"),
            (self.max_tool_rounds >= 1, "max_tool_rounds", "must be at least 1"),
            (self.pool_size >= 1, "pool_size", "must be at least 1"),
            (self.pool_every >= 1, "pool_every", "must be at least 1"),
            (self.eval_every >= 0, "eval_every", "must be >= 0"),
            (self.eval_samples >= 1, "eval_samples", "must be at least 1"),
            (self.save_every >= 0, "save_every", "must be >= 0"),
            (self.threads >= 0, "threads", "must be >= 0 (0 = torch's default)"),
            (
                self.dtype in ("float32", "bfloat16", "float16"),
                "dtype",
                "must be float32, bfloat16 or float16",
            ),
            (self.lora.r >= 1, "lora.r", "must be at least 1"),
            (self.lora.alpha > 0, "lora.alpha", "must be positive"),
            (bool(self.lora.targets), "lora.targets", "must name at least one module"),
        ]
        for ok, key, why in checks:
            if not ok:
                raise ConfigError(f"{key} {why} (got {_get(self, key)!r})")
        specs = [("simulator", self.simulator)] + [
            (f"heldout[{i}]", s) for i, s in enumerate(self.heldout)
        ]
        for where, spec in specs:
            _validate_simulator(where, spec)
        training = self.simulator.weights(self.base_model_path())
        for i, spec in enumerate(self.heldout):
            if training is not None and spec.weights(self.base_model_path()) == training:
                raise ConfigError(
                    f"heldout[{i}] ({spec.name!r}) runs on the training simulator's weights "
                    f"({training[-1]}): a held-out user must share no weights with the "
                    "simulator the agent trains against (another model, an endpoint serving "
                    'one, or kind = "scripted")'
                )
        names = [s.name for s in self.heldout]
        if len(set(names)) != len(names):
            raise ConfigError(f"heldout simulators need distinct names (got {names})")
        if self.rollout_endpoint and self.finetune != "lora":
            raise ConfigError(
                'rollout_endpoint needs finetune = "lora" (the server loads adapters)'
            )
        if self.regime == "verbalized" and self.simulator.kind != "verbalized":
            raise ConfigError('regime "verbalized" needs simulator.kind = "verbalized"')
        if self.simulator.kind == "scripted" and self.trains_simulator:
            raise ConfigError(f'regime "{self.regime}" trains the simulator: it cannot be scripted')
        if self.trains_simulator and (self.simulator.endpoint or self.simulator.kind != "plain"):
            raise ConfigError(
                f'regime "{self.regime}" trains the simulator in-process: '
                "simulator.kind must be plain and simulator.endpoint empty"
            )
        return self


def load_config(path: str | Path) -> RunConfig:
    """Read a TOML file into a validated RunConfig."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no config file at {path}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        return RunConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _validate_simulator(where: str, spec: SimulatorSpec) -> None:
    if spec.kind not in SIMULATOR_KINDS:
        raise ConfigError(
            f"{where}.kind must be one of {', '.join(SIMULATOR_KINDS)} (got {spec.kind!r})"
        )
    if spec.draw not in DRAW_MODES:
        raise ConfigError(
            f"{where}.draw must be one of {', '.join(DRAW_MODES)} (got {spec.draw!r})"
        )
    if spec.endpoint and not spec.model:
        raise ConfigError(f"{where}: an endpoint simulator needs `model` (the served model name)")
    if spec.kind == "scripted" and spec.script not in SCRIPTED_TYPES:
        raise ConfigError(
            f"{where}.script must be one of {', '.join(SCRIPTED_TYPES)} (got {spec.script!r})"
        )
    if spec.kind == "scripted" and (spec.endpoint or spec.model or spec.adapter):
        raise ConfigError(f"{where}: a scripted simulator has no model, adapter or endpoint")
    if spec.api_key_env and not spec.endpoint:
        raise ConfigError(f"{where}.api_key_env is for an endpoint simulator (set `endpoint`)")
    if not spec.name.strip():
        raise ConfigError(f"{where}.name must not be empty")
    if spec.temperature <= 0 or spec.max_new_tokens < 1 or spec.k < 2 or spec.retries < 0:
        raise ConfigError(
            f"{where}: temperature must be positive, max_new_tokens >= 1, k >= 2, retries >= 0"
        )


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a TOML table, checking every key and value type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else key
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown key {dotted!r}{hint} (known: {', '.join(sorted(fields))})")
        kwargs[key] = _coerce(fields[key].type, value, dotted)
    missing = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and n not in kwargs
    ]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(missing)}")
    obj = cls(**kwargs)
    return obj.validate() if isinstance(obj, RunConfig) else obj


_NESTED = {"TaskSpec": TaskSpec, "SimulatorSpec": SimulatorSpec, "LoraSpec": LoraSpec}


def _coerce(annotation: str, value: Any, where: str) -> Any:
    """Check a TOML value against the field's annotation (a string, as annotations are postponed)."""
    if annotation in _NESTED:
        return _build(_NESTED[annotation], value, where)
    if annotation == "list[SimulatorSpec]":
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be an array of tables ([[{where}]])")
        return [_build(SimulatorSpec, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if annotation == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings (got {value!r})")
        return list(value)
    expected = {"str": str, "int": int, "float": (int, float), "bool": bool}[annotation]
    # bool is an int in Python; refuse `steps = true` and `scale_std = 1`
    if isinstance(value, bool) != (annotation == "bool") or not isinstance(value, expected):
        raise ConfigError(f"{where} must be {annotation} (got {value!r})")
    return float(value) if annotation == "float" else value
