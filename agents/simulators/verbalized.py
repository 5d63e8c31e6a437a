"""Verbalized Sampling: the simulator writes k possible replies with probabilities and one
is drawn, so training sees the simulator's spread of behaviour instead of its mode.

`VerbalizedSampling` holds the settings (k, draw mode, retries) and the steps (system prompt,
schema, reading an answer, the draw, the retry rule) and needs no client: VerbalizedSimulator
asks a model over agents.llm with it, and the trainer (training's in-process simulator) asks
its own model with it. The pure pieces (`parse_verbalized`, `draw`, `verbalized_schema`) are
also used directly by tests.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.domains.base import Domain, Message, Scenario
from agents.simulators.base import (
    Candidate,
    Simulator,
    UserTurn,
    match_choice,
    with_instruction,
)

K = 5
PROBABILITY_FLOOR = 1e-6
# How one candidate is drawn: by its verbalized probability, or uniformly (the paper's "random"
# variant). The one declaration of these names: training's config reads it from here.
MODES = ("probability", "uniform")

INSTRUCTIONS = """Output format: instead of a single reply, write {k} different replies you \
might send next, each with the probability that you would send it. Each text is one complete \
message in your role that follows every rule above; keep any marker the rules ask for (such as \
[DONATE $N], ###STOP###) inside the text of a reply that uses it. The probabilities are your \
own estimate, between 0 and 1, of how likely each reply is.
Return ONLY this JSON object, with exactly {k} items and no other text:
{{"responses": [{{"text": "...", "probability": 0.4}}, ...]}}"""


class _Random(Protocol):
    def random(self) -> float: ...


def verbalized_schema(
    k: int = K, texts: list[str] | tuple[str, ...] | None = None
) -> dict[str, Any]:
    """The JSON schema of exactly k {text, probability} items, for constrained decoding; with
    `texts`, every candidate's text must be one of them (a choice turn, e.g. the P4G markers)."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    text: dict[str, Any] = {"type": "string"}
    if texts:
        text["enum"] = list(texts)
    item = {
        "type": "object",
        "properties": {"text": text, "probability": {"type": "number"}},
        "required": ["text", "probability"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"responses": {"type": "array", "items": item, "minItems": k, "maxItems": k}},
        "required": ["responses"],
        "additionalProperties": False,
    }


def response_format(k: int = K, texts: list[str] | None = None) -> dict[str, Any]:
    """The OpenAI `response_format` asking the engine to enforce `verbalized_schema(k, texts)`."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "verbalized_sampling",
            "strict": True,
            "schema": verbalized_schema(k, texts),
        },
    }


def _find_object(text: str) -> dict[str, Any]:
    """The first JSON object holding "responses", wherever it sits (code fences, chatter)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    found_json = False
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pass
        else:
            found_json = True
            if isinstance(value, dict) and "responses" in value:
                return value
        start = text.find("{", start + 1)
    if '"responses"' in text:
        raise ValueError(
            f'simulator output has "responses" but not as valid JSON (cut off?): {text[:80]!r}'
        )
    if found_json:
        raise ValueError('simulator output has no JSON object with a "responses" key')
    raise ValueError(f"simulator output is not JSON: {text[:80]!r}")


def _probability(value: Any, index: int) -> float:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"response {index}: probability must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"response {index}: probability must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"response {index}: probability must be finite and >= 0, got {value!r}")
    return number


def parse_verbalized(text: str, k: int = K) -> list[Candidate]:
    """The k (text, probability) candidates in a simulator's output, probabilities floored at
    1e-6 and normalized to sum to 1. Raises ValueError saying what is wrong otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"simulator output must be a string, got {type(text).__name__}")
    responses = _find_object(text)["responses"]
    if not isinstance(responses, list):
        raise ValueError(f'"responses" must be a list, got {type(responses).__name__}')
    if len(responses) != k:
        raise ValueError(f"expected exactly {k} responses, got {len(responses)}")
    texts, probabilities = [], []
    for i, item in enumerate(responses):
        if not isinstance(item, dict):
            raise ValueError(f"response {i}: expected an object, got {item!r}")
        reply = item.get("text")
        if not isinstance(reply, str) or not reply.strip():
            raise ValueError(f"response {i}: missing or empty text")
        if "probability" not in item:
            raise ValueError(f"response {i}: missing probability")
        texts.append(reply.strip())
        probabilities.append(max(_probability(item["probability"], i), PROBABILITY_FLOOR))
    total = sum(probabilities)
    return [Candidate(t, p / total) for t, p in zip(texts, probabilities, strict=True)]


def weights(candidates: list[Candidate], mode: str = "probability") -> list[float]:
    """The weights a draw uses: the written probabilities (floored), or all alike."""
    if mode == "uniform":
        return [1 / len(candidates)] * len(candidates)
    if mode != "probability":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return [max(c.probability, PROBABILITY_FLOOR) for c in candidates]


def draw(candidates: list[Candidate], rng: _Random, mode: str = "probability") -> Candidate:
    """One candidate: weighted by probability, or uniformly (the paper's "random" variant).
    `rng` is anything with .random() (random.Random, numpy Generator)."""
    if not candidates:
        raise ValueError("no candidates to draw from")
    if mode == "uniform":
        return candidates[min(int(rng.random() * len(candidates)), len(candidates) - 1)]
    weight = weights(candidates, mode)
    target, cumulative = rng.random() * sum(weight), 0.0
    for candidate, w in zip(candidates, weight, strict=True):
        cumulative += w
        if target < cumulative:
            return candidate
    return candidates[-1]  # rounding left target at the very top


@dataclass(frozen=True)
class VerbalizedSampling:
    """k candidates per reply, one drawn by `mode`; an answer that does not parse is asked
    again `retries` times, then its raw text is used (the reference README's rule)."""

    k: int = K
    mode: str = "probability"
    retries: int = 2

    def __post_init__(self):
        verbalized_schema(self.k)  # validates k
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")

    def system_prompt(self, base: str) -> str:
        """A simulator's system prompt with the instructions to answer with k candidates."""
        return base + "\n\n" + INSTRUCTIONS.format(k=self.k)

    def schema(self, choices: list[str] | tuple[str, ...] | None = None) -> dict[str, Any]:
        return verbalized_schema(self.k, choices)

    def response_format(self, choices: list[str] | None = None) -> dict[str, Any]:
        return response_format(self.k, choices)

    def read(self, raw: str, choices: list[str] | tuple[str, ...] | None = None) -> list[Candidate]:
        """The candidates of one answer; ValueError when it does not parse or, on a choice
        turn, a candidate is not one of the allowed texts."""
        candidates = parse_verbalized(raw, self.k)
        if choices:
            texts = [match_choice(c.text, choices) for c in candidates]
            if None in texts:
                raise ValueError(f"a candidate is not one of the allowed texts {list(choices)}")
            candidates = [
                Candidate(t, c.probability) for t, c in zip(texts, candidates, strict=True)
            ]
        return candidates

    def distribution(self, candidates: list[Candidate], choices: list[str]) -> list[float]:
        """The probability the draw gives each allowed text (a choice turn's Decision)."""
        weight = weights(candidates, self.mode)
        total = sum(weight)
        return [
            sum(w for c, w in zip(candidates, weight, strict=True) if c.text == text) / total
            for text in choices
        ]

    def answer(self, rng: _Random, choices: list[str] | tuple[str, ...] | None = None) -> Answer:
        return Answer(self, rng, choices)


@dataclass
class Answer:
    """One reply asked of a Verbalized Sampling simulator, over its attempts: `take` each raw
    output until `done`; the first that reads has one candidate drawn at once (so a seeded rng
    draws in the order answers arrive), else after the last attempt its raw text stands."""

    sampling: VerbalizedSampling
    rng: _Random
    choices: list[str] | tuple[str, ...] | None = None
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    turn: UserTurn | None = None

    @property
    def done(self) -> bool:
        return self.turn is not None

    def take(self, raw: str) -> None:
        self.attempts += 1
        try:
            candidates = self.sampling.read(raw, self.choices)
        except ValueError as exc:
            self.errors.append(str(exc))
            if self.attempts > self.sampling.retries:
                self.turn = UserTurn(raw.strip(), raw, None, self.attempts, True, self.errors)
            return
        chosen = draw(candidates, self.rng, self.sampling.mode)
        self.turn = UserTurn(chosen.text, raw, candidates, self.attempts, False, self.errors)


class VerbalizedSimulator(Simulator):
    """Asks for k candidates (schema-constrained when `structured`), draws one; a malformed
    answer is retried `retries` times, then the raw text of the last answer is used."""

    def __init__(
        self,
        client: Any,
        model: str,
        k: int = K,
        mode: str = "probability",
        structured: bool = True,
        retries: int = 2,
        rng: _Random | int | None = None,
        **params: Any,
    ):
        super().__init__(client, model, **params)
        self.sampling = VerbalizedSampling(k, mode, retries)
        self.structured = structured
        self.rng = rng if hasattr(rng, "random") else random.Random(rng)

    def system_prompt(self, domain: Domain, scenario: Scenario) -> str:
        return self.sampling.system_prompt(super().system_prompt(domain, scenario))

    async def answer(self, messages: list[Message], choices: list[str] | None) -> UserTurn:
        """`choices`: the texts every candidate must be (a choice turn); needs `structured`."""
        params = dict(self.params)
        if self.structured:
            params["response_format"] = self.sampling.response_format(choices)
        if choices and not (self.structured and self.enforces_choices()):
            # the schema's enum is not held here: the allowed texts are asked for in words
            note = "(Every reply's text must be exactly one of: " + ", ".join(choices) + ".)"
            messages = with_instruction(messages, note)
        answer, usage = self.sampling.answer(self.rng, choices), []
        while not answer.done:
            result = await self.client.chat(self.model, messages, **params)
            usage.append(result.usage)
            answer.take(result.content or "")
        answer.turn.usage = usage
        return answer.turn
