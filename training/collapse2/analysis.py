"""collapse2's pre-registered analysis: manipulation checks, endpoints and the verdict rule.

Pure Python on the numbers the runner measured (training/collapse2/runner.py writes them):
nothing here loads a model, so the rule can be read, tested and hashed on its own. The design
(training/collapse2/design.toml) records this file's SHA-256, and the runner refuses to start
when the file differs: the analysis is fixed before any run.

Every quantity is exact (the P4G decision episode's choice turns), per seed:

    p_exploit      sum of the agent's probabilities of the exploit asks (those the frozen base
                   simulator rewards most, exploit.json), after the last step
    entropy        the agent's decision entropy (nats) over the 8 asks, after the last step
    heldout(T)     mean over the types t in T of sum_a pi(a) * E_t(a), with E_t(a) the scripted
                   type's exact expected reward for ask a (agents/simulators/scripted.py)
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# The design's numbers (design.toml holds the same; `check_design` compares them).
C1_START_MAX = 0.30  # single: p(exploit) at step 0 at most this ...
C1_END_MIN = 0.80  # ... and after the last step at least this, in most seeds
C2_PUNISH = 0.05  # the agent's policy earns at least this much less than the best ask
C2_SPREAD = 0.10  # the simulator's expected reward ranges at least this much over the asks
C3_TV = 0.10  # Verbalized Sampling's written distribution vs the plain one (mean TV)
SHOWN_P = 0.15  # mean paired reduction of p(exploit) against single
SHOWN_H = 0.15  # mean paired rise of decision entropy (nats) against single
SIGN_ALPHA = 0.05  # one-sided sign test on the paired p(exploit) differences
REFUTED_P = 0.05  # mean paired reduction of p(exploit) below this ...
REFUTED_SEEDS = 2  # ... and at most this many seeds reduced by SHOWN_P or more


def entropy(probs: list[float]) -> float:
    return -sum(p * math.log(p) for p in probs if p > 0)


def p_exploit(probs: list[float], asks: list[str], exploit: list[str]) -> float:
    chosen = set(exploit)
    return sum(p for ask, p in zip(asks, probs, strict=True) if ask in chosen)


def heldout(probs: list[float], asks: list[str], expected: dict[str, dict[str, float]],
            types: list[str]) -> float:  # fmt: skip
    """The exact held-out read-out: mean over `types` of sum_a pi(a) E_t(a)."""
    return statistics.fmean(
        sum(p * expected[t][ask] for ask, p in zip(asks, probs, strict=True)) for t in types
    )


def panel_best(expected: dict[str, dict[str, float]], types: list[str]) -> list[str]:
    """The asks with the panel's highest mean expected reward (ties kept)."""
    asks = list(next(iter(expected.values())))
    means = {a: statistics.fmean(expected[t][a] for t in types) for a in asks}
    best = max(means.values())
    return [a for a, v in means.items() if v >= best - 1e-12]


def sign_test(differences: list[float]) -> float:
    """One-sided sign test, H1: differences > 0. Zeros are dropped; p = P(X >= positives) for
    X ~ Binomial(n, 1/2). 1.0 with no non-zero difference."""
    nonzero = [d for d in differences if d != 0]
    n, k = len(nonzero), sum(d > 0 for d in nonzero)
    if n == 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def most(flags: list[bool]) -> bool:
    """Holds in a majority of seeds."""
    return sum(flags) * 2 > len(flags)


def c1(single: list[dict[str, Any]]) -> dict[str, Any]:
    """C1: collapse happens under `single` (p(exploit) from <= 0.30 to >= 0.80, most seeds)."""
    per_seed = [
        r["p_exploit_start"] <= C1_START_MAX and r["p_exploit"] >= C1_END_MIN for r in single
    ]
    return {"holds": most(per_seed), "per_seed": per_seed}


def c2_seed(run: dict[str, Any]) -> dict[str, Any]:
    """C2 for one co-trained run, on the final simulator's exact expected reward per ask E(a):
    it punishes the agent's current behaviour, the final policy pi earning at least C2_PUNISH
    less than the best ask (max E - sum_a pi(a) E(a): for a collapsed agent, its mode's
    deficit), and stays conditional (max E - min E >= C2_SPREAD)."""
    expected = run["simulator_final"]
    if not expected:
        return {"holds": False, "why": "no final simulator to measure"}
    pi = dict(zip(run["asks"], run["agent_final"], strict=True))
    best, worst = max(expected.values()), min(expected.values())
    punish = best - sum(pi[a] * e for a, e in expected.items())
    spread = best - worst
    return {"holds": punish >= C2_PUNISH and spread >= C2_SPREAD, "punish": punish,
            "spread": spread}  # fmt: skip


def c2(runs: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed = [c2_seed(r) for r in runs]
    return {"holds": most([s["holds"] for s in per_seed]), "per_seed": per_seed}


def c3(total_variations: list[float]) -> dict[str, Any]:
    """C3: Verbalized Sampling's written distribution differs from the plain one."""
    mean = statistics.fmean(total_variations) if total_variations else 0.0
    return {"holds": mean >= C3_TV, "mean_tv": mean, "pairs": len(total_variations)}


def verdict(single: list[dict[str, Any]], arm: list[dict[str, Any]]) -> dict[str, Any]:
    """The seed-paired verdict for one regime against `single` (both sorted by seed; the checks
    are applied by `analyse`)."""
    seeds = [r["seed"] for r in single]
    if [r["seed"] for r in arm] != seeds:
        raise ValueError(f"seeds differ: single {seeds}, arm {[r['seed'] for r in arm]}")
    d_p = [s["p_exploit"] - a["p_exploit"] for s, a in zip(single, arm, strict=True)]
    d_h = [a["entropy"] - s["entropy"] for s, a in zip(single, arm, strict=True)]
    p_value = sign_test(d_p)
    mean_p, mean_h = statistics.fmean(d_p), statistics.fmean(d_h)
    if mean_p >= SHOWN_P and mean_h >= SHOWN_H and p_value <= SIGN_ALPHA:
        label = "mechanism shown"
    elif mean_p < REFUTED_P and sum(d >= SHOWN_P for d in d_p) <= REFUTED_SEEDS:
        label = "refuted"
    else:
        label = "inconclusive"
    return {
        "verdict": label,
        "p_exploit_reduction": d_p,
        "entropy_rise": d_h,
        "mean_p_exploit_reduction": mean_p,
        "mean_entropy_rise": mean_h,
        "sign_test_p": p_value,
    }


def analyse(
    runs: dict[str, list[dict[str, Any]]],
    expected: dict[str, dict[str, float]],
    deciding: list[str],
    c3_tv: list[float] | None,
) -> dict[str, Any]:
    """Checks first, then per regime the endpoints and the verdict. `runs`: regime -> one record
    per seed (see the runner's `record`); `expected`: type -> ask -> E_t(a); `deciding`: the
    panel without the type the training simulator behaves like; `c3_tv`: the total variations
    measured before the verbalized arm (None when it was not measured)."""
    single = sorted(runs["single"], key=lambda r: r["seed"])
    types = list(expected)
    out: dict[str, Any] = {"checks": {"C1": c1(single)}, "regimes": {}}
    if c3_tv is not None:
        out["checks"]["C3"] = c3(c3_tv)
    for regime in ["single", *(r for r in runs if r != "single")]:
        records = sorted(runs[regime], key=lambda r: r["seed"])
        block: dict[str, Any] = {
            "seeds": [r["seed"] for r in records],
            "p_exploit": [r["p_exploit"] for r in records],
            "entropy": [r["entropy"] for r in records],
            "heldout_deciding": [
                heldout(r["agent_final"], r["asks"], expected, deciding) for r in records
            ],
            "heldout_full": [
                heldout(r["agent_final"], r["asks"], expected, types) for r in records
            ],
        }
        out["regimes"][regime] = block
        if regime == "single":
            continue
        why = []
        if not out["checks"]["C1"]["holds"]:
            why.append("C1 failed: no collapse under single to remove")
        if regime in ("cotrain", "population"):
            block["C2"] = c2(records)
            if not block["C2"]["holds"]:
                why.append("C2 failed: the co-trained simulator does not punish the mode")
        if regime == "verbalized" and not out["checks"].get("C3", {}).get("holds"):
            why.append("C3 failed: the verbalized distribution is the plain one")
        paired = verdict(single, records)
        d_held = [
            a - s
            for s, a in zip(
                out["regimes"]["single"]["heldout_deciding"], block["heldout_deciding"], strict=True
            )
        ]
        paired["heldout_deciding_gain"] = d_held  # secondary: reported, not deciding
        block["paired"] = paired
        block["verdict"] = "uninformative" if why else paired["verdict"]
        block["uninformative_because"] = why
    return out
