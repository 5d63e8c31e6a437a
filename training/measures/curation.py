"""COLLAPSE-AWARE's curation of the agent's training data ([curation], opt-in): a quality gate,
then a weight per rollout, applied by the GRPO loss as per-sequence loss weights (the
advantages untouched: training/rl/grpo.py grpo_loss).

    gate      a rollout is dropped (weight 0) when its SIMULATOR's side failed (GATES):
              a fallback to raw text, an empty turn, a turn cut at max_new_tokens (counted
              where it is sampled: in this process or by vLLM; a Verbalized simulator's cut
              JSON shows as its fallback), a tool-call block that did not parse. The agent's own failures are never gated: they are what
              its reward teaches it to avoid. A dropped rollout's reward still counts in its
              group's mean (the advantages are computed as without curation) and its tokens in
              the batch's count, as a rollout of advantage 0 does.
    weight    w(tau) = (1 / MCI(s(tau))) * exp(-alpha * density(z(tau))) * balance(tau)
              s(tau)   the simulator that played tau (the regime's pooled_name of its member)
              MCI(s)   = sum_k p_k^2 / (sum_k p_k)^2 over s's cluster shares
                       (agents/behaviour/measures.py), from its replies to the fixed probe
                       set where it was probed, else its turns in this step's rollouts
              z(tau)   the mean of tau's free-text simulator turns in the behaviour space
                       (centred, unit-length embeddings: BehaviourSpace.vectors), made unit
              density(z_i) = 1/(n-1) sum_{j != i} exp(-||z_i - z_j||^2 / (2 h^2))
                       a Gaussian kernel density among the step's n kept rollouts, in [0, 1];
                       h = bandwidth, or the median pairwise distance when bandwidth = 0
              balance(tau) = n / (M * n_{mode(tau)}) with mode_balance, else 1: each of the M
                       behaviour clusters present among the n rollouts (mode = z's nearest
                       centroid) gets an equal share of the batch's weight
    normalise w_i <- w_i * n_kept / sum_kept w     (mean 1 over the kept rollouts)
              w_i <- clip(w_i, min_weight, max_weight), then normalised once more (a clipped
              batch may end a little past the clip; the mean stays 1)
    ESS       = (sum_i w_i)^2 / sum_i w_i^2 over the kept rollouts (n_kept when every w is 1)

The 1/MCI factor is the proposal's gradient scaling of high-MCI simulators: after the
normalisation it moves weight between simulators, so with one simulator (regime single) it
cancels. A kept rollout without free-text simulator turns (a P4G persuadee that only made its
decision) cannot be placed in the space: it gets the mean weight of the measured ones and no
mode.

Mode-balanced batches "where the rollout pool allows": parley trains on every rollout a step
plays, so there is no surplus pool to draw a balanced batch from; balancing re-weights the
rollouts instead, and is possible only where the step's kept rollouts reach at least 2
clusters (with one, balance is 1 for all; curation/modes says how many there were). A lone
rollout of a rare mode is held to max_weight.

Keys (metrics.jsonl): curation/kept, curation/gated, curation/gated/<reason>, curation/ess,
curation/ess_share (ESS / kept), curation/weight_min, curation/weight_max, and where weights
are measured curation/density_mean, curation/modes, curation/mci/<simulator>.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agents.behaviour import measures as m
from agents.domains.episode import USER
from agents.llm.tool_format import OPEN
from training.rollouts.rollout import Rollout
from training.vocabulary import CURATION_GATES

# the gate's reasons, in the order they are checked (config: curation.gate)
GATES = tuple(CURATION_GATES)


def gate_reasons(rollout: Rollout, gates: Sequence[str] = GATES) -> list[str]:
    """Why `rollout` fails the quality gate (its simulator's side), among `gates`; [] = kept."""
    users = [x for x in rollout.conversation if x.get("role") == "user"]
    found = {
        "fallback": rollout.fallbacks > 0,
        "empty": any(
            not str(x.get("content") or "").strip() and not x.get("tool_calls") for x in users
        ),
        "cut": rollout.cut_turns.get(USER, 0) > 0,
        # parse_tool_calls leaves a block it cannot read in the content as text
        "parse": bool(rollout.user_tools)
        and any(OPEN in str(x.get("content") or "") for x in users),
    }
    return [g for g in gates if found[g]]


@dataclass
class Summary:
    """What the curation needs of one rollout: small, so the ranks can gather it."""

    simulator: str
    texts: list[str]  # its free-text simulator turns (a choice turn's text left out)
    reasons: list[str]  # why the gate drops it ([] = kept)


def summarise(rollout: Rollout, simulator: str, gates: Sequence[str]) -> Summary:
    decision = rollout.decision(USER)
    chosen = decision.texts[decision.index] if decision else None
    texts = [
        str(x.get("content") or "").strip() for x in rollout.conversation if x.get("role") == "user"
    ]
    return Summary(simulator, [t for t in texts if t and t != chosen], gate_reasons(rollout, gates))


def kernel_density(z: np.ndarray, bandwidth: float = 0.0) -> np.ndarray:
    """density(z_i) = 1/(n-1) sum_{j != i} exp(-||z_i - z_j||^2 / (2 h^2)), each in [0, 1]
    (1: every other rollout at the same point; 0: none near). h = `bandwidth`, or the median
    distance between distinct rollouts when 0 (1 when they all coincide: any h gives 1 then).
    Fewer than 2 rollouts: 0 (no crowd to be in)."""
    n = len(z)
    if n < 2:
        return np.zeros(n)
    d2 = np.maximum((z * z).sum(1)[:, None] - 2 * z @ z.T + (z * z).sum(1)[None], 0.0)
    h = bandwidth
    if h <= 0:
        pairs = np.sqrt(d2[np.triu_indices(n, 1)])
        h = float(np.median(pairs)) or 1.0
    kernel = np.exp(-d2 / (2 * h * h))
    np.fill_diagonal(kernel, 0.0)
    return kernel.sum(1) / (n - 1)


def mode_balance(modes: Sequence[int]) -> np.ndarray:
    """balance_i = n / (M * n_{mode_i}): each of the M modes present gets total weight n / M."""
    counts: dict[int, int] = {}
    for k in modes:
        counts[k] = counts.get(k, 0) + 1
    n, present = len(modes), len(counts)
    return np.array([n / (present * counts[k]) for k in modes], dtype=np.float64)


def normalise(
    raw: Sequence[float],
    kept: Sequence[bool],
    min_weight: float = 0.0,
    max_weight: float = math.inf,
) -> list[float]:
    """Mean 1 over the kept rollouts, clipped to [min_weight, max_weight], then mean 1 once
    more; a dropped rollout's weight is 0. No kept rollout: all 0."""
    w = np.where(np.asarray(kept, dtype=bool), np.asarray(raw, dtype=np.float64), 0.0)
    n = int(np.sum(kept))
    if n == 0 or w.sum() <= 0:
        return [0.0] * len(w)
    w = w * (n / w.sum())
    w = np.where(kept, np.clip(w, min_weight, max_weight), 0.0)
    w = w * (n / w.sum())
    return w.tolist()


def ess(weights: Sequence[float]) -> float:
    """ESS = (sum w)^2 / sum w^2 over the weights > 0 (0 when there are none)."""
    w = [x for x in weights if x > 0]
    return sum(w) ** 2 / sum(x * x for x in w) if w else 0.0


class Curation:
    """A run's curation: its settings and (where weights are measured) its behaviour space,
    the one the run's profiles measure in (training/measures/behaviour_space.py)."""

    def __init__(self, spec: Any, space: Any = None):
        self.spec, self.space = spec, space  # space: on rank 0 alone, which weighs

    def step(
        self,
        mine: list[Rollout],
        probed: dict[str, list[Any]],
        ranks: Any,
        name: Callable[[str], str],
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """This rank's rollouts' weights and the step's curation row. Weighed over the whole
        step on rank 0 (which holds the space), then shared: every rank gets the same row and
        its own rows' weights. `probed`: each simulator's probe replies (profiles.Reply)."""
        own = [summarise(r, name(r.member), self.spec.gate) for r in mine]
        every = ranks.gather(own)
        result = [self.weigh(every, probed)] if ranks.main else []
        weights, row = ranks.gather(result)[0]
        start = sum(ranks.gather([len(mine)])[: ranks.rank])
        return torch.tensor(weights[start : start + len(mine)], dtype=torch.float32), row

    def weigh(
        self, rollouts: list[Summary], probed: dict[str, list[Any]] | None = None
    ) -> tuple[list[float], dict[str, float]]:
        """Every rollout's weight (the module's formula) and the step's curation row."""
        spec, probed = self.spec, probed or {}
        kept = [not r.reasons for r in rollouts]
        row: dict[str, float] = {
            "curation/kept": float(sum(kept)),
            "curation/gated": float(len(kept) - sum(kept)),
        }
        for reason in spec.gate:
            row[f"curation/gated/{reason}"] = float(sum(reason in r.reasons for r in rollouts))
        raw = np.ones(len(rollouts))
        if spec.weighs:
            raw = self._diversity(rollouts, kept, probed, row)
        weights = normalise(raw, kept, spec.min_weight, spec.max_weight)
        live = [w for w, k in zip(weights, kept, strict=True) if k]
        row["curation/ess"] = ess(live)
        row["curation/ess_share"] = row["curation/ess"] / len(live) if live else 0.0
        row["curation/weight_min"] = min(live, default=0.0)
        row["curation/weight_max"] = max(live, default=0.0)
        return weights, row

    def _diversity(
        self,
        rollouts: list[Summary],
        kept: list[bool],
        probed: dict[str, list[Any]],
        row: dict[str, float],
    ) -> np.ndarray:
        """The raw weights (1/MCI) * exp(-alpha * density) * balance of the kept rollouts."""
        spec, space = self.spec, self.space
        if space is None:
            raise ValueError("curation.diversity and mode_balance need the run's behaviour space")
        raw = np.ones(len(rollouts))
        measured = [i for i, r in enumerate(rollouts) if kept[i] and r.texts]
        if not measured:
            return raw
        z = np.stack([space.vectors(rollouts[i].texts).mean(0) for i in measured])
        z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        factor = np.ones(len(measured))
        if spec.diversity:
            density = kernel_density(z, spec.bandwidth)
            row["curation/density_mean"] = float(density.mean())
            inverse = {}
            for s in sorted({rollouts[i].simulator for i in measured}):
                inverse[s] = 1.0 / self._mci(s, rollouts, probed)
                row[f"curation/mci/{s}"] = 1.0 / inverse[s]
            factor = np.array([inverse[rollouts[i].simulator] for i in measured])
            factor = factor * np.exp(-spec.alpha * density)
        modes = ((z[:, None, :] - space.centroids[None]) ** 2).sum(-1).argmin(1).tolist()
        row["curation/modes"] = float(len(set(modes)))
        if spec.mode_balance:
            factor = factor * mode_balance(modes)
        raw[measured] = factor
        unmeasured = [i for i, k in enumerate(kept) if k and not rollouts[i].texts]
        raw[unmeasured] = factor.mean()  # no place in the space: the measured ones' mean
        return raw

    def _mci(self, simulator: str, rollouts: list[Summary], probed: dict[str, list[Any]]) -> float:
        """MCI of `simulator` in the space's clusters: from its probe replies' free text where
        it was probed, else from its turns in this step's rollouts (every one, gated or not:
        its behaviour as it played)."""
        texts = [r.text for r in probed.get(simulator, []) if r.decision is None and r.text]
        if not texts:
            texts = [t for r in rollouts if r.simulator == simulator for t in r.texts]
        return m.mci(m.shares(self.space.assign(texts), self.space.k))
