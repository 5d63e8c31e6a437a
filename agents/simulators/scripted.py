"""Scripted P4G persuadees with hidden types: a held-out panel that shares no weights with any
model being trained or simulated.

Written down before any collapse run (see docs/training.md) and not tuned after: each type is a
rule from the persuasion literature turning what the persuader said (the amount it asked for,
the kind of appeal it made) into a distribution over the five decisions $0, $0.50, $1, $1.50, $2.
The persuader never sees the type. At the paper's scale the panel is other LLMs (hosted
endpoints); on this machine the only model is SmolLM2, which is also the training simulator, so
a held-out panel of LLMs cannot exist here and these scripted types stand in for it.

    anchored    gives what is asked more often than not (anchoring on suggested amounts)
    reactant    a modest ask works; a large one provokes refusal (psychological reactance,
                Brehm 1966): asks of $1.50 or more mostly get nothing
    analytical  moved by evidence about the charity, not by the amount or by emotion
    empathic    moved by emotional appeals about children, then gives near the ask
    steady      decided before the chat; nothing said changes it
"""

from __future__ import annotations

import random
import re
from typing import Any

from agents.domains.base import Message
from agents.domains.p4g.donation import DECISION_AMOUNTS, MAX_DONATION, marker
from agents.messages import message_text

Distribution = dict[float, float]  # decision amount -> probability

EVIDENCE_WORDS = re.compile(
    r"\b(?:countr(?:y|ies)|since 19\d\d|founded|evidence|report(?:s|ed)?|rated|percent|%|"
    r"audit\w*|transparen\w*|efficien\w*|statistic\w*|research|healthcare|schooling|vaccin\w*)",
    re.IGNORECASE,
)
EMOTION_WORDS = re.compile(
    r"\b(?:hungry|hunger|sick|suffer\w*|imagine|feel\w*|heart\w*|story|stories|safer|"
    r"scared|alone|afraid|crying|starv\w*|desperate)\b",
    re.IGNORECASE,
)
_DOLLARS = re.compile(r"\$\s*(\d+(?:\.\d+)?|\.\d+)")


def _nearest(amount: float) -> float:
    return min(DECISION_AMOUNTS, key=lambda a: abs(a - amount))


def _mix(*parts: tuple[float, float]) -> Distribution:
    dist = dict.fromkeys(DECISION_AMOUNTS, 0.0)
    for amount, p in parts:
        dist[_nearest(amount)] += p
    return dist


def anchored(ask: float | None, appeal: str | None) -> Distribution:
    if ask is None:
        return _mix((0.5, 0.5), (0.0, 0.5))
    below = max(a for a in DECISION_AMOUNTS if a < ask)
    return _mix((ask, 0.6), (below, 0.25), (0.0, 0.15))


def reactant(ask: float | None, appeal: str | None) -> Distribution:
    if ask is None or ask <= 1.0:
        return _mix((ask or 0.5, 0.7), (0.0, 0.3))
    return _mix((0.0, 0.8), (0.5, 0.2))


def analytical(ask: float | None, appeal: str | None) -> Distribution:
    if appeal == "evidence":
        return _mix((1.0, 0.5), (1.5, 0.3), (0.0, 0.2))
    return _mix((0.0, 0.7), (0.5, 0.3))


def empathic(ask: float | None, appeal: str | None) -> Distribution:
    if appeal == "emotion":
        return _mix((ask if ask is not None else 1.0, 0.5), (1.0, 0.3), (0.5, 0.2))
    return _mix((0.5, 0.5), (0.0, 0.5))


def steady(ask: float | None, appeal: str | None) -> Distribution:
    return _mix((0.5, 0.5), (1.0, 0.3), (0.0, 0.2))


TYPES = {f.__name__: f for f in (anchored, reactant, analytical, empathic, steady)}

# What a type says before it decides (free-text dialogue turns; the decision episode has none).
REMARKS = {
    "anchored": "Okay, how much were you thinking of?",
    "reactant": "I don't like being pushed. Why should I?",
    "analytical": "What evidence is there that the money is used well?",
    "empathic": "That's sad. Who does it help, exactly?",
    "steady": "I see. Go on.",
}


def read_ask(conversation: list[Message]) -> tuple[float | None, str | None]:
    """The amount the persuader last asked for (clamped to 0..2, None if it named none) and the
    kind of appeal it made ("evidence", "emotion" or None), from all of its messages."""
    said = [message_text(m) for m in conversation if m.get("role") == "assistant"]
    amounts = [float(x) for text in said for x in _DOLLARS.findall(text)]
    # "$2 payment" style mentions of the task's own payment are not an ask
    asks = [a for text in said for a in _asks_in(text)]
    ask = asks[-1] if asks else (amounts[-1] if len(set(amounts)) == 1 else None)
    text = " ".join(said)
    evidence, emotion = len(EVIDENCE_WORDS.findall(text)), len(EMOTION_WORDS.findall(text))
    appeal = None
    if evidence or emotion:
        appeal = "evidence" if evidence > emotion else "emotion" if emotion > evidence else None
    return (None if ask is None else min(max(ask, 0.0), MAX_DONATION)), appeal


def _asks_in(text: str) -> list[float]:
    """Amounts inside a question or a request ("Would you give $1 ...?", "donate $0.50")."""
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if "?" in sentence or re.search(r"\b(?:donate|give|contribute|spare)\b", sentence, re.I):
            found += [float(x) for x in _DOLLARS.findall(sentence)]
    return found


class ScriptedPersuadee:
    """One hidden type as a user simulator: `decision(conversation)` is its exact distribution;
    `reply` says a remark, or draws its decision when `choices` (the markers) are asked for."""

    def __init__(self, kind: str, rng: random.Random | None = None):
        if kind not in TYPES:
            raise ValueError(f"unknown scripted type {kind!r}: expected one of {', '.join(TYPES)}")
        self.kind, self.rng = kind, rng or random.Random(0)

    def decision(self, conversation: list[Message]) -> Distribution:
        return TYPES[self.kind](*read_ask(conversation))

    def reply(self, conversation: list[Message], choices: list[str] | None) -> str:
        if not choices:
            return REMARKS[self.kind]
        dist = self.decision(conversation)
        amounts, weights = zip(*dist.items(), strict=True)
        amount = self.rng.choices(amounts, weights=weights)[0]
        text = marker(amount)
        if text not in choices:
            raise ValueError(f"the task's choices {choices} do not include {text}")
        return text

    def expected_reward(self, conversation: list[Message]) -> float:
        return sum(p * min(a / MAX_DONATION, 1.0) for a, p in self.decision(conversation).items())


def describe_types() -> dict[str, Any]:
    """Each type's expected reward for every ask of the decision episode (for the README)."""
    from agents.domains.p4g.decision import ASKS

    return {
        kind: {
            f"{appeal} {amount:g}": round(
                ScriptedPersuadee(kind).expected_reward([{"role": "assistant", "content": text}]),
                3,
            )
            for (appeal, amount), text in ASKS.items()
        }
        for kind in TYPES
    }
