"""Reply diversity per step, and the collapse warnings (metrics.jsonl, diversity.png):

    sim/distinct_1            distinct unigrams / all unigrams over the step's user turns
    sim/distinct_2            distinct bigrams / all bigrams over the same turns
    sim/top_opening_share     share of the step's conversations whose first user turn is the
                              most frequent one (1.0: every conversation opened alike)
    sim/embedding_dispersion  mean pairwise cosine distance between the user turns' embeddings
                              (only with collapse.embedding_model, a local model folder)
    agent/distinct_1, agent/distinct_2   the same over the agent's turns

The agent's entropy is the GRPO step's `entropy` (token entropy of its sampled tokens,
training/rl/grpo.py), not computed again here.

A token is a word: the text lowercased, split into runs of letters, digits and apostrophes
(punctuation dropped), so "Hi, there!" and "hi there" are the same two tokens. n-grams do not
cross turns. Unlike training/measures/collapse.py these need no choice turns: they hold for free text on
any Domain (on a choice turn the user's reply is one of a few fixed texts, so they count which
ones were used; sim/decision_entropy there is the exact measure).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agents.behaviour import embedder
from agents.messages import message_text

_WORD = re.compile(r"[\w']+")

Embed = Callable[[list[str]], list[list[float]]]


def words(text: str) -> list[str]:
    """The tokens distinct-n counts (see the module's docstring)."""
    return _WORD.findall(text.lower())


def distinct_n(texts: Iterable[str], n: int) -> float | None:
    """Distinct n-grams / all n-grams over `texts` (Li et al. 2016); None when there are none."""
    grams = [
        tuple(tokens[i : i + n]) for tokens in map(words, texts) for i in range(len(tokens) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else None


def top_share(texts: Sequence[str]) -> float | None:
    """Share of `texts` equal to the most frequent one (compared as their words, so case and
    punctuation do not make two replies differ); None for no texts."""
    if not texts:
        return None
    counts = Counter(" ".join(words(t)) for t in texts)
    return counts.most_common(1)[0][1] / len(texts)


def dispersion(vectors: Sequence[Sequence[float]]) -> float | None:
    """Mean cosine distance over the pairs of `vectors` (0: all point the same way); None for
    fewer than two. With unit vectors the sum of all pairwise cosines is |sum of v|^2 - n."""
    if len(vectors) < 2:
        return None
    units = []
    for v in vectors:
        norm = math.sqrt(sum(x * x for x in v))
        units.append([x / norm for x in v] if norm else [0.0] * len(v))
    total = [sum(col) for col in zip(*units, strict=True)]
    n = len(units)
    same = sum(x * x for x in total) - sum(sum(x * x for x in u) for u in units)
    return 1.0 - same / (n * (n - 1))


def turns(conversation: Sequence[dict[str, Any]], role: str) -> list[str]:
    """The visible texts `role` ("user" or "assistant") said (an agent's bare tool calls are
    not text)."""
    return [
        text for m in conversation if m.get("role") == role and (text := message_text(m).strip())
    ]


def step_diversity(
    conversations: Sequence[Sequence[dict[str, Any]]], embed: Embed | None = None
) -> dict[str, float]:
    """The module's measures over one step's conversations; a measure with nothing to count
    (no user turn, no bigram) is left out rather than written as 0."""
    user = [t for c in conversations for t in turns(c, "user")]
    agent = [t for c in conversations for t in turns(c, "assistant")]
    openings = [said[0] for c in conversations if (said := turns(c, "user"))]
    values = {
        "sim/distinct_1": distinct_n(user, 1),
        "sim/distinct_2": distinct_n(user, 2),
        "sim/top_opening_share": top_share(openings),
        "agent/distinct_1": distinct_n(agent, 1),
        "agent/distinct_2": distinct_n(agent, 2),
    }
    if embed is not None and len(user) > 1:
        values["sim/embedding_dispersion"] = dispersion(embed(user))
    return {k: v for k, v in values.items() if v is not None}


class Embedder(embedder.Embedder):
    """The [collapse] embedding model (agents/behaviour/embedder.py: mean-pooled last hidden
    states of a local model folder)."""

    setting = "collapse.embedding_model"


# -- warnings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    key: str  # the metrics.jsonl key
    field: str  # the [collapse] config key holding the bound
    below: bool  # True: warn when the value falls below the bound; False: when it rises above
    what: str


THRESHOLDS = (
    Threshold(
        "sim/distinct_2", "min_sim_distinct_2", True, "simulator reply diversity (distinct-2)"
    ),
    Threshold(
        "sim/top_opening_share",
        "max_sim_top_opening_share",
        False,
        "share of the most frequent opening user reply",
    ),
    Threshold(
        "sim/embedding_dispersion", "min_sim_dispersion", True, "simulator embedding dispersion"
    ),
    Threshold("entropy", "min_agent_entropy", True, "agent token entropy (nats/token)"),
)


def crossed(row: dict[str, Any], limits: Any) -> list[dict[str, Any]]:
    """The thresholds of `limits` (a CollapseSpec) that this step's row crosses."""
    found = []
    for t in THRESHOLDS:
        value, bound = row.get(t.key), getattr(limits, t.field)
        if not isinstance(value, int | float) or not math.isfinite(value):
            continue
        if (value < bound) if t.below else (value > bound):
            sign = "<" if t.below else ">"
            found.append(
                {
                    "step": row["step"],
                    "key": t.key,
                    "value": value,
                    "threshold": bound,
                    "message": f"step {row['step']}: {t.what} {value:.3g} {sign} "
                    f"collapse.{t.field} = {bound:g}",
                }
            )
    return found


class Warnings:
    """The first crossing of each threshold in a run, in step order; `rows` are the steps
    already logged (a resumed run warns again of nothing it warned of before)."""

    def __init__(self, limits: Any, rows: Iterable[dict[str, Any]] = ()):
        self.limits = limits
        self.seen: list[dict[str, Any]] = []
        for row in rows:
            self.check(row)

    def check(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """This row's new crossings (also kept in `seen`)."""
        keys = {w["key"] for w in self.seen}
        new = [w for w in crossed(row, self.limits) if w["key"] not in keys]
        self.seen += new
        return new
