"""A user simulator as a run declares it (a training run's `[simulator]`, `[[ensemble]]` and
`[[heldout]]` tables), and `build`, which makes the agents.simulators simulator it names.

Declared once here, below training and studies: training's rollouts play it, and studies'
held-out conversations play the same tables read back from a checkpoint's manifest, so the two
cannot drift apart. A pydantic dataclass (`dataclasses.replace` and `asdict` keep working);
training/config.py reads its errors into ConfigError, naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from agents.llm.providers import (
    PROVIDER_CHOICES,
    REASONING_EFFORTS,
    Provider,
    provider_for,
    sampling_params,
)
from agents.simulators.base import Simulator
from agents.simulators.plain import PlainSimulator
from agents.simulators.scripted import TYPES as SCRIPTED_TYPES
from agents.simulators.scripted import ScriptedPersuadee
from agents.simulators.verbalized import MODES as DRAW_MODES
from agents.simulators.verbalized import VerbalizedSimulator

if TYPE_CHECKING:
    from agents.llm import LLMClient


class SimulatorKind(StrEnum):
    """What plays the user: a model writing one reply, a model writing Verbalized Sampling's k
    replies with probabilities (one is drawn), or a scripted held-out type."""

    PLAIN = "plain"
    VERBALIZED = "verbalized"
    SCRIPTED = "scripted"


# which sampling settings an endpoint simulator sends (agents/llm/providers.py sampling_params)
SIMULATOR_SAMPLINGS = {
    "sent": "temperature is sent, and top_p unless it is 1.0",
    "provider": "neither temperature nor top_p is sent: the provider's defaults apply (1.0 on"
    " OpenAI, Anthropic, Gemini and OpenRouter), as the release's hosted tau2 users sample",
}

# -- what every declared table shares (training/config_schema.py's tables too) -------------------

# unknown keys are errors: a typo never plays silently with a default
TABLE = ConfigDict(extra="forbid")


def refuse(key: str, value: Any, why: str) -> PydanticCustomError:
    """A cross-field rule's error: `key` relative to the table that checks it (training/config.py
    _config_error reads the "rule" type and its key, value and why)."""
    return PydanticCustomError("rule", "{key} {why}", {"key": key, "value": value, "why": why})


def one_of(values: Iterable[Any]) -> str:
    return ", ".join('""' if v == "" else str(v) for v in values)


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", "must not be empty")
    return text


Name = Annotated[StrictStr, AfterValidator(_not_blank)]
SimulatorSampling = Literal[tuple(SIMULATOR_SAMPLINGS)]
SimulatorKindName = Literal[tuple(k.value for k in SimulatorKind)]
DrawMode = Literal[DRAW_MODES]
Script = Literal[(*SCRIPTED_TYPES, "")]
ProviderName = Literal[PROVIDER_CHOICES]
ReasoningEffort = Literal[REASONING_EFFORTS]


@dataclass(config=TABLE)
class SimulatorSpec:
    """A user simulator. In-process (the base model or `model`, a local HF folder) unless `endpoint`
    names an OpenAI-compatible server, in which case `model` is the served model name. A
    co-trained simulator (regimes cotrain, population) learns in this process; with `endpoint`
    its turns are sampled by that vLLM server from the adapter it loads after each update, and
    `model` is the local folder of its base model, the one the server serves under that path.
    A `scripted` simulator is one of the P4G persuadee types of agents/simulators/scripted.py."""

    name: Name = Field("base", description="how metrics and the held-out panel name it")
    kind: SimulatorKindName = Field(
        SimulatorKind.PLAIN.value,
        description="plain: one reply | verbalized: k candidates with probabilities, one drawn"
        " | scripted: a persuadee type (`script`)",
    )
    model: StrictStr = Field(
        "", description='a local model folder, or the served model name; "" = the run\'s base model'
    )
    endpoint: StrictStr = Field(
        "",
        description='base URL of an OpenAI-compatible server; "" = in-process. A co-trained'
        " simulator's: a vLLM server of `model` with runtime LoRA loading",
    )
    api_key_env: StrictStr = Field(
        "", description="endpoint: the environment variable holding its API key (never the key)"
    )
    script: Script = Field("", description='kind = "scripted": the persuadee type')
    adapter: StrictStr = Field(
        "",
        description="a LoRA adapter put on the in-process model: its folder, or the name of a"
        " registered checkpoint (<data dir>/checkpoints/<name>, e.g. a human-like simulator)",
    )
    persona: StrictStr = Field(
        "", description="extra text appended to the simulator's system prompt"
    )
    guidelines: StrictStr = Field(
        "",
        description='regime "persona": behavioural guidelines put before the simulator\'s system'
        " prompt; \"\" = the Domain's default (tau2: the release's text)",
    )
    seen: StrictBool = Field(
        False,
        description="[[heldout]] only: this panel member IS a simulator the agent trains against"
        " (the release's 6-model panel keeps each run's training simulators): allowed on its"
        " weights, reported beside the others and left out of the heldout/unseen_* means",
    )
    temperature: StrictFloat = Field(0.7, gt=0, description="sampling temperature")
    sampling: SimulatorSampling = Field(
        "sent",
        description="endpoint: which sampling settings its requests carry: "
        + " | ".join(f"{k}: {v}" for k, v in SIMULATOR_SAMPLINGS.items()),
    )
    max_new_tokens: StrictInt = Field(64, ge=1, description="tokens per reply")
    k: StrictInt = Field(5, ge=2, description="verbalized: candidates per reply")
    draw: DrawMode = Field(
        "probability",
        description="verbalized: how one candidate is drawn (probability | uniform, the paper's"
        ' "random" variant)',
    )
    retries: StrictInt = Field(
        2,
        ge=0,
        description="re-asks after a malformed verbalized reply, or an endpoint simulator's"
        " choice-turn answer that is none of the choices, before using the raw text",
    )
    provider: ProviderName = Field(
        "auto",
        description="endpoint: how requests are shaped for its API (agents/llm/providers.py);"
        " auto = recognised from the endpoint URL and model id, generic = sent as given",
    )
    top_p: StrictFloat = Field(
        1.0,
        gt=0,
        le=1,
        description="endpoint: nucleus sampling (1.0 = not sent; the paper's panel uses 0.95)."
        " GPT-5-family models sample with their own fixed settings and are sent neither this"
        " nor temperature",
    )
    reasoning_effort: ReasoningEffort = Field(
        "",
        description="endpoint: a reasoning model's effort (\"\" = not sent, the provider's"
        " default); refused for providers that ignore or refuse it",
    )

    @model_validator(mode="after")
    def _rules(self) -> SimulatorSpec:
        if self.endpoint and not self.model:
            raise refuse(
                "model",
                self.model,
                "must name the served model: an endpoint simulator needs `model`",
            )
        if self.kind == SimulatorKind.SCRIPTED:
            if self.script not in SCRIPTED_TYPES:
                raise refuse(
                    "script",
                    self.script,
                    f'must be one of {one_of(SCRIPTED_TYPES)} for kind = "scripted"',
                )
            for key in ("endpoint", "model", "adapter"):
                if getattr(self, key):
                    raise refuse(
                        key,
                        getattr(self, key),
                        "must be empty: a scripted simulator has no model, adapter or endpoint",
                    )
        if self.api_key_env and not self.endpoint:
            raise refuse(
                "api_key_env", self.api_key_env, "is for an endpoint simulator (set `endpoint`)"
            )
        if self.sampling == "provider":
            # not sent, so not settable: a value here would read as sent (the defaults are
            # what to_dict writes, so a saved config loads again)
            for key, unset in (("temperature", 0.7), ("top_p", 1.0)):
                if getattr(self, key) != unset:
                    raise refuse(
                        key,
                        getattr(self, key),
                        'is not sent with sampling = "provider" (the provider\'s default'
                        ' applies): remove it, or set sampling = "sent"',
                    )
        if not self.endpoint:
            for key, unset in (
                ("provider", "auto"),
                ("top_p", 1.0),
                ("reasoning_effort", ""),
                ("sampling", "sent"),
            ):
                if getattr(self, key) != unset:
                    raise refuse(
                        key,
                        getattr(self, key),
                        "is for an endpoint simulator (set `endpoint`; in-process sampling uses"
                        " temperature alone)",
                    )
        else:
            provider = self.provider_spec()
            if provider.serves(self.endpoint) and provider.key_env and not self.api_key_env:
                raise refuse(
                    "api_key_env",
                    self.api_key_env,
                    f"must name the variable holding the key of {provider.label} (conventionally"
                    f" {provider.key_env})",
                )
            refused = provider.refusal(self.sent_temperature(), self.reasoning_effort)
            if refused:
                key, why = refused
                raise refuse(key, getattr(self, key), f"cannot be sent as asked: {why}")
        return self

    def provider_spec(self) -> Provider:
        """The provider an endpoint simulator's requests are shaped for."""
        return provider_for(self.provider, self.endpoint, self.model)

    def request_params(self) -> dict[str, Any]:
        """An endpoint simulator's generation settings in agents.llm's common vocabulary (the
        client shapes them for the provider): what every turn sends, and the dry run too."""
        return sampling_params(
            self.sent_temperature(),
            self.max_new_tokens,
            None if self.sampling == "provider" else self.top_p,
            self.reasoning_effort,
        )

    def sent_temperature(self) -> float | None:
        """The temperature its requests carry; None: not sent (sampling = "provider")."""
        return None if self.sampling == "provider" else self.temperature

    def adapter_path(self) -> Path | None:
        """The adapter's folder: `adapter` as a path when it is one, else the registered
        checkpoint of that name (its link under <data dir>/checkpoints)."""
        if not self.adapter:
            return None
        path = Path(self.adapter).expanduser()
        if path.is_dir() or "/" in self.adapter:
            return path
        from agents.paths import adapters_dir

        return adapters_dir() / self.adapter

    def weights(self, base_model: Path) -> tuple[str, ...] | None:
        """What identifies this simulator's weights: the same tuple means the same model. An
        adapter makes other weights (a fine-tuned simulator on the training simulator's base
        is another user, as another model is)."""
        if self.kind == SimulatorKind.SCRIPTED:
            return None
        if self.endpoint:
            return ("endpoint", self.endpoint.rstrip("/"), self.model)
        model = Path(self.model).expanduser().resolve() if self.model else base_model.resolve()
        adapter = self.adapter_path()
        return ("local", str(model)) + ((str(adapter.resolve()),) if adapter else ())


def with_persona(prompt: str, persona: str) -> str:
    """A simulator's system prompt with the extra persona text of its SimulatorSpec."""
    return f"{prompt}\n\n{persona}" if persona else prompt


def spec_prompt(prompt: str, spec: SimulatorSpec) -> str:
    """A simulator's system prompt as its SimulatorSpec shapes it: the Persona-Guided guidelines
    first, a blank line, then the prompt (the release's order: CHATS-lab/scope_usim
    usim/core/environment/tau2/environment.py, _ConfiguredAgentGymEnv), the persona after."""
    prompt = with_persona(prompt, spec.persona)
    return f"{spec.guidelines.strip()}\n\n{prompt}" if spec.guidelines else prompt


def build(
    spec: SimulatorSpec, client: LLMClient | None = None, rng: random.Random | None = None
) -> Simulator | ScriptedPersuadee:
    """The simulator `spec` declares, for a process that asks it turn by turn: a scripted
    persuadee type (no client), or a plain or Verbalized Sampling simulator asking on `client`
    (the spec's endpoint with its key and provider; the caller opens and closes it) with the
    spec's request_params, its system prompt shaped by spec_prompt. An in-process simulator
    samples from training's own model instead (training/rollouts/simulator.py LocalUser)."""
    rng = rng or random.Random(0)
    if spec.kind == SimulatorKind.SCRIPTED:
        return ScriptedPersuadee(spec.script, rng)
    if client is None:
        raise ValueError(f"simulator {spec.name!r} asks an endpoint: build it with its client")
    params = spec.request_params()  # shaped for its provider by the client
    if spec.kind == SimulatorKind.VERBALIZED:
        simulator: Simulator = VerbalizedSimulator(
            client, spec.model, k=spec.k, mode=spec.draw, retries=spec.retries, rng=rng, **params
        )
    else:
        simulator = PlainSimulator(client, spec.model, retries=spec.retries, **params)
    base = simulator.system_prompt
    simulator.system_prompt = lambda d, s: spec_prompt(base(d, s), spec)
    return simulator
