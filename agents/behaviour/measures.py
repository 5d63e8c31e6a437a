"""COLLAPSE-AWARE's four measures of simulator behaviour, each written once beside its
definition. They are plain functions over behaviour-cluster shares (a simulator's share of its
turns in each cluster of one BehaviourSpace, agents/behaviour/space.py), so the training's
profiles, the curation, the breaker and the study's sim-to-real report compute them the same
way.

    p_k        a simulator's share of its turns in behaviour cluster k (sum_k p_k = 1)
    MCI        mode concentration index of one simulator
               = sum_k p_k^2 / (sum_k p_k)^2
               1/K when its turns spread evenly over K clusters, 1 when every turn is one mode
    SCD(t)     simulator collapse degree of the population at step t
               = 1 - H(q) / H_max, q the pooled behaviour distribution, H_max = log K
               0 when the population spreads evenly, 1 when it is one mode
    BDI(D)     behavioural diversity index: the share of real users' behaviour support (the
               clusters the reference corpus D occupies) that the simulators' behaviour covers
    PSOD       policy-simulator overfitting degree
               = R(agent; training simulators) - R(agent; held-out simulators)
    JSD        Jensen-Shannon distance between two share vectors (the sim-to-real report's
               "how alike", beside BDI's "how much of the people's behaviour is reached")

Without a human reference the proposal's fallback for BDI is relative: the coverage growth
between steps (`coverage_growth`), never to be read as a BDI.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence


def shares(labels: Sequence[int], k: int) -> list[float]:
    """p_k: the share of `labels` (cluster indices 0..k-1) in each cluster."""
    if not labels:
        raise ValueError("behaviour shares of no turns")
    counts = [0] * k
    for label in labels:
        counts[label] += 1
    return [c / len(labels) for c in counts]


def mixture(distributions: Sequence[Sequence[float]]) -> list[float]:
    """The even mixture of several share vectors (the pooled population, each simulator
    weighted alike; or a simulator's exact shares averaged over its probes)."""
    if not distributions:
        raise ValueError("a mixture of no distributions")
    n = len(distributions)
    return [sum(column) / n for column in zip(*distributions, strict=True)]


def mci(p: Sequence[float]) -> float:
    """MCI = sum_k p_k^2 / (sum_k p_k)^2 (the proposal's definition; the denominator makes it
    hold for unnormalised counts too)."""
    total = sum(p)
    if total <= 0:
        raise ValueError("MCI of an empty distribution")
    return sum(x * x for x in p) / (total * total)


def shannon(probs: Sequence[float]) -> float:
    """H(p) = -sum_k p_k log p_k in nats (0 log 0 = 0) of a distribution that sums to 1
    (training/rl/choices.py's `entropy` of a choice turn's probabilities is this one)."""
    return -sum(x * math.log(x) for x in probs if x > 0)


def entropy(p: Sequence[float]) -> float:
    """H(p) in nats over the normalised p (0 log 0 = 0): counts or shares alike."""
    total = sum(p)
    return shannon([x / total for x in p])


def jensen_shannon(p: Sequence[float], q: Sequence[float]) -> float:
    """JSD(p, q) = sqrt( (KL(p || m) + KL(q || m)) / (2 log 2) ), m = (p + q) / 2, over the
    normalised p and q: the Jensen-Shannon divergence in bits, square-rooted (a metric). 0 when
    the shares are the same, 1 when no cluster holds both. KL(p || m) = H(p, m) - H(p) and
    H(m) - (H(p) + H(q)) / 2 is the divergence, so it is written with `entropy`."""
    if len(p) != len(q):
        raise ValueError(f"Jensen-Shannon of share vectors of {len(p)} and {len(q)} clusters")
    if sum(p) <= 0 or sum(q) <= 0:
        raise ValueError("Jensen-Shannon of an empty distribution")
    p = [x / sum(p) for x in p]
    q = [x / sum(q) for x in q]
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    divergence = entropy(m) - (entropy(p) + entropy(q)) / 2  # nats
    return math.sqrt(max(divergence, 0.0) / math.log(2))  # rounding can leave -1e-17


def scd(q: Sequence[float]) -> float:
    """SCD = 1 - H(q) / H_max, H_max = log K, K = len(q) (every cluster of the space, occupied
    or not: an empty cluster is behaviour the population does not show)."""
    if len(q) < 2:
        raise ValueError("SCD needs a space of at least 2 clusters")
    return 1.0 - entropy(q) / math.log(len(q))


def support(reference: Sequence[float], min_share: float) -> set[int]:
    """The clusters real users occupy: those holding at least `min_share` of the reference."""
    return {k for k, x in enumerate(reference) if x > 0 and x >= min_share}


def covered(p: Sequence[float], min_share: float) -> set[int]:
    """The clusters a simulator's behaviour covers: share above 0 and at least `min_share`."""
    return {k for k, x in enumerate(p) if x > 0 and x >= min_share}


def bdi(simulated: set[int], reference: Sequence[float], min_share: float) -> float:
    """BDI = sum_{k in S ∩ C} r_k / sum_{k in S} r_k, S = support(r) the people's clusters, C
    the simulators' covered ones: the share of the real users' behaviour (by its mass) that the
    simulators' behaviour reaches. Behaviour outside the support counts for nothing; with an
    even reference it is the share of the support's clusters covered."""
    people = support(reference, min_share)
    if not people:
        raise ValueError("BDI against a reference with no support")
    return sum(reference[k] for k in people & simulated) / sum(reference[k] for k in people)


def coverage_growth(now: set[int], before: set[int], k: int) -> float:
    """The relative form (no human reference): the clusters covered now and not at the step
    before, as a share of the space's K (negative when coverage shrank: the lost ones count)."""
    return (len(now - before) - len(before - now)) / k


def psod(training_reward: float, heldout_reward: float) -> float:
    """PSOD = R(agent; training simulators) - R(agent; held-out simulators)."""
    return training_reward - heldout_reward


def bootstrap(
    labels: Sequence[int],
    statistic: Callable[[Sequence[int]], float],
    draws: int,
    seed: str,
    level: float = 0.9,
) -> tuple[float, float]:
    """A percentile bootstrap interval of `statistic` over `labels` resampled with
    replacement `draws` times (seeded, so the same labels give the same interval)."""
    if draws < 1 or len(labels) < 2:
        value = statistic(labels)
        return value, value
    rng = random.Random(seed)
    values = sorted(statistic(rng.choices(labels, k=len(labels))) for _ in range(draws))
    tail = (1 - level) / 2
    lo = values[int(tail * (draws - 1))]
    hi = values[int(math.ceil((1 - tail) * (draws - 1)))]
    return lo, hi
