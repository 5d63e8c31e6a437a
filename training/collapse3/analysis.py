"""collapse3's pre-registered analysis: the pilots' rules, the go/no-go gate, the manipulation
checks, the endpoints and the verdict rule.

Pure Python on the numbers the runner measured (training/collapse3/runner.py writes them):
nothing here loads a model, so the rule can be read, tested and hashed on its own. The
registration (training/collapse3/registration.toml) records this file's SHA-256 beside the
design's, the runner's and the equilibrium table's, and the runner refuses to start when any
differs: all four are fixed before any run.

Every quantity is exact (the P4G decision episode's choice turns), per seed:

    p_exploit      sum of the agent's probabilities of the exploit asks (those the frozen base
                   simulator rewards most, exploit.json), after the last step
    entropy        the agent's decision entropy (nats) over the 8 asks, after the last step
    E_k(a)         the co-trained simulator's exact expected reward for ask a (the agent's
                   reward, mean over the training personas) at checkpoint step k
    heldout(T)     mean over the types t in T of sum_a pi(a) * E_t(a), E_t the scripted type's
                   exact expected reward for ask a (agents/simulators/scripted.py)

Kept from collapse2 (training/collapse2/analysis.py): C1, C3, the endpoints, the verdict and its
sign test, with the same numbers. New: C2 is a property of the simulator alone (collapse2's
"max E - sum pi E" passed whenever the agent was not yet on the simulator's best ask, even when
that ask was the exploit), C4 (the agent is steered), the agent-lr pilot's rule and the gate.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# The design's numbers (design.toml holds the same; the runner's `load_design` compares them).
C1_START_MAX = 0.30  # single: p(exploit) at step 1 at most this ...
C1_END_MIN = 0.80  # ... and after the last step at least this, in most seeds
C2_MARGIN = 0.02  # the best non-exploit ask earns at least this more than the best exploit ask
C2_SPREAD = 0.10  # and the simulator's expected reward ranges at least this much over the asks
C2_CHECKPOINTS = [8, 12, 16]  # the fixed checkpoints (steps) C2 is read at
C2_CHECKPOINTS_MIN = 2  # C2 holds for a seed at at least this many of them
C3_TV = 0.10  # Verbalized Sampling's written distribution vs the plain one (mean TV)
STEER_STD = 0.05  # C4: a step steers the agent when its group's reward std exceeds this ...
STEER_SHARE = 0.5  # ... in more than this share of the run's steps, in most seeds
SHOWN_P = 0.15  # mean paired reduction of p(exploit) against single
SHOWN_H = 0.15  # mean paired rise of decision entropy (nats) against single
SIGN_ALPHA = 0.05  # one-sided sign test on the paired p(exploit) differences
REFUTED_P = 0.05  # mean paired reduction of p(exploit) below this ...
REFUTED_SEEDS = 2  # ... and at most this many seeds reduced by SHOWN_P or more

# The proposal's guessed baselines (COLLAPSE-AWARE, issue 40's "stage zero"): reported beside
# the secondary endpoints, never compared against a threshold.
GUESSED_BASELINES = {"single SCD": "> 0.8", "co-training SCD": "~0.6", "BDI": "~0.6",
                     "PSOD": "~0.2"}  # fmt: skip


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
    """Holds in a majority of seeds (with 2 seeds: both)."""
    return sum(flags) * 2 > len(flags)


# -- C1 and the agent's learning rate --------------------------------------------------------


def c1_seed(run: dict[str, Any]) -> bool:
    return run["p_exploit_start"] <= C1_START_MAX and run["p_exploit"] >= C1_END_MIN


def c1(single: list[dict[str, Any]]) -> dict[str, Any]:
    """C1: collapse happens under `single` (p(exploit) from <= 0.30 to >= 0.80, most seeds)."""
    per_seed = [c1_seed(r) for r in single]
    return {"holds": most(per_seed), "per_seed": per_seed}


def choose_lr(pilot: dict[float, list[dict[str, Any]]]) -> dict[str, Any]:
    """The agent's learning rate from the C1 pilot (single, pilot seeds): the smallest
    candidate at which C1 holds in every pilot seed (the slowest collapse leaves a co-trained
    simulator the most steps to answer it); if none, the candidate with the largest mean final
    p(exploit), ties to the smaller (C1 will then likely fail on the main seeds too, and the
    report says so)."""
    per_lr = {lr: {"c1": [c1_seed(r) for r in runs],
                   "p_exploit": [r["p_exploit"] for r in runs]}
              for lr, runs in pilot.items()}  # fmt: skip
    passing = sorted(lr for lr, v in per_lr.items() if v["c1"] and all(v["c1"]))
    if passing:
        lr, passed = passing[0], True
    else:
        lr = max(sorted(per_lr), key=lambda x: statistics.fmean(per_lr[x]["p_exploit"]))
        passed = False
    return {"lr": lr, "c1_in_every_pilot_seed": passed,
            "per_lr": {f"{k:g}": v for k, v in per_lr.items()},
            "rule": "smallest lr with C1 in every pilot seed; else largest mean final "
                    "p(exploit), ties to the smaller"}  # fmt: skip


# -- C2: the exploit is not the co-trained simulator's best ask --------------------------------


def c2_at(expected: dict[str, float], exploit: list[str]) -> dict[str, Any]:
    """C2 on one simulator's exact expected reward per ask E(a): the exploit is not its best ask
    (margin = max over the other asks of E - max over the exploit asks of E >= C2_MARGIN) and
    it stays conditional (spread = max E - min E >= C2_SPREAD). A compliant simulator (gives
    what it is asked) pays the largest ask most, which is the exploit: it fails."""
    chosen = set(exploit)
    others = [e for a, e in expected.items() if a not in chosen]
    mine = [e for a, e in expected.items() if a in chosen]
    if not others or not mine:
        raise ValueError(f"C2 needs exploit and non-exploit asks: exploit {exploit}")
    margin = max(others) - max(mine)
    spread = max(expected.values()) - min(expected.values())
    return {"holds": margin >= C2_MARGIN and spread >= C2_SPREAD, "margin": margin,
            "spread": spread}  # fmt: skip


def c2_seed(run: dict[str, Any]) -> dict[str, Any]:
    """C2 for one co-trained run: at the fixed checkpoints C2_CHECKPOINTS (a missing one counts
    as failed), holding at at least C2_CHECKPOINTS_MIN of them."""
    at = run.get("simulator_at") or {}
    per_step = {}
    for step in C2_CHECKPOINTS:
        expected = at.get(str(step))
        per_step[step] = c2_at(expected, run["exploit"]) if expected else {"holds": False}
    held = sum(v["holds"] for v in per_step.values())
    margins = [v["margin"] for v in per_step.values() if "margin" in v]
    spreads = [v["spread"] for v in per_step.values() if "spread" in v]
    return {
        "holds": held >= C2_CHECKPOINTS_MIN,
        "checkpoints_held": held,
        "per_checkpoint": {str(k): v for k, v in per_step.items()},
        "mean_margin": statistics.fmean(margins) if margins else float("-inf"),
        "mean_spread": statistics.fmean(spreads) if spreads else float("-inf"),
    }


def c2(runs: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed = [c2_seed(r) for r in runs]
    return {"holds": most([s["holds"] for s in per_seed]), "per_seed": per_seed}


# -- C3, C4 ----------------------------------------------------------------------------------


def c3(total_variations: list[float]) -> dict[str, Any]:
    """C3: Verbalized Sampling's written distribution differs from the plain one."""
    mean = statistics.fmean(total_variations) if total_variations else 0.0
    return {"holds": mean >= C3_TV, "mean_tv": mean, "pairs": len(total_variations)}


def c4_seed(run: dict[str, Any]) -> dict[str, Any]:
    """C4 for one co-trained run: the agent is steered, its group's reward std above STEER_STD
    in more than STEER_SHARE of the steps (a step whose 8 rewards are equal gives the agent no
    gradient, whatever the simulator does)."""
    stds = run["series"].get("reward_std") or []
    share = sum(s > STEER_STD for s in stds) / len(stds) if stds else 0.0
    return {"holds": share > STEER_SHARE, "share": share}


def c4(runs: list[dict[str, Any]]) -> dict[str, Any]:
    per_seed = [c4_seed(r) for r in runs]
    return {"holds": most([s["holds"] for s in per_seed]), "per_seed": per_seed}


# -- the go/no-go gate for the co-trained arms -------------------------------------------------


def gate(window: list[float], pilot: dict[tuple[float, float], list[dict[str, Any]]]) -> dict:
    """Go when at least one (simulator weight, simulator lr) setting of the gate's grid holds
    C2 in most pilot seeds (cotrain, pilot seeds; C2 only). The chosen setting: the most pilot
    seeds holding C2, then the larger mean margin, then the smaller simulator lr. No-go without
    a pilot when the equilibrium table's window is empty (no weight can pass C2 at equilibrium).
    `pilot`: (weight, simulator lr) -> one record per pilot seed."""
    if not window:
        return {"go": False, "why": "no KL weight satisfies C2 at the exact equilibrium "
                "(equilibrium.json): the gate was not run", "per_setting": {}}  # fmt: skip
    scores, per_setting = {}, {}
    for (weight, lr), runs in pilot.items():
        seeds = [c2_seed(r) for r in runs]
        per_setting[f"w{weight:g}-lr{lr:g}"] = seeds
        margin = statistics.fmean(s["mean_margin"] for s in seeds) if seeds else -math.inf
        scores[(weight, lr)] = (most([s["holds"] for s in seeds]), sum(s["holds"] for s in seeds),
                                margin, -lr)  # fmt: skip
    passing = [k for k, v in scores.items() if v[0]]
    if not passing:
        return {"go": False, "why": "no setting of the gate's grid held C2 in most pilot seeds: "
                "the precondition could not be established at 135M",
                "per_setting": per_setting}  # fmt: skip
    weight, lr = max(passing, key=lambda k: scores[k][1:])
    return {"go": True, "simulator_beta": weight, "simulator_lr": lr, "per_setting": per_setting,
            "rule": "most pilot seeds holding C2, then larger mean margin, then smaller "
                    "simulator lr"}  # fmt: skip


# -- the verdict ----------------------------------------------------------------------------


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


def secondary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """COLLAPSE-AWARE's measures for one arm (decide nothing): each behaviour/ and psod/ key of
    the runs' last metrics row, and the runner's exact forms, as lists over seeds."""
    keys = sorted({k for r in records for k in (r.get("secondary") or {})})
    return {k: [r["secondary"][k] for r in records if k in (r.get("secondary") or {})]
            for k in keys}  # fmt: skip


def analyse(
    runs: dict[str, list[dict[str, Any]]],
    expected: dict[str, dict[str, float]],
    deciding: list[str],
    c3_tv: list[float] | None,
) -> dict[str, Any]:
    """Checks first, then per regime the endpoints and the verdict. `runs`: regime -> one record
    per seed (the runner's `record`); `expected`: type -> ask -> E_t(a); `deciding`: the panel
    without the type the training simulator behaves like; `c3_tv`: the total variations
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
            "exploit_earns": [r.get("exploit_earns") for r in records],
            "secondary": secondary(records),
        }
        # PSOD's exact form: R(agent; the simulator it trained against at the end) - R(agent;
        # the deciding held-out panel), both sum_a pi(a) E(a) (secondary)
        block["secondary"]["exact/psod"] = [
            r["secondary"]["exact/R_train"] - h
            for r, h in zip(records, block["heldout_deciding"], strict=True)
            if "exact/R_train" in (r.get("secondary") or {})
        ]
        out["regimes"][regime] = block
        if regime == "single":
            continue
        why = []
        if not out["checks"]["C1"]["holds"]:
            why.append("C1 failed: no collapse under single to remove")
        if regime in ("cotrain", "population"):
            block["C2"] = c2(records)
            if not block["C2"]["holds"]:
                why.append("C2 failed: the exploit stays the co-trained simulator's best ask")
            block["C4"] = c4(records)
            if not block["C4"]["holds"]:
                why.append("C4 failed: the agent's rewards had no spread to steer it")
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
