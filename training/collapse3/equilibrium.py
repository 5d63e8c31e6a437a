"""collapse3's precondition: the exact equilibrium of the co-trained simulator's update, per KL
weight, from the base SmolLM2 persuadee's exact decision probabilities.

With `simulator_update = "exact"` (training/regimes/exact_update.py) and scale_std = false, the
co-trained simulator's loss on one prompt x (an ask a played to one persona) is

    L(pi) = -sum_m pi(m) A(m) + w KL(pi || b),   A(m) = s(m) - V,   KL = sum_m pi(m) log(pi(m)/b(m))

over P4G's five decision markers m, with pi the simulator's distribution at its sampling
temperature, b its base's (the LoRA adapter off) at the same temperature, w = simulator_beta,
s(m) the simulator's reward had it answered m, and V = sum_m pi(m) s(m) held without gradient.
Since sum_m grad pi(m) = 0, V does not move the gradient, so the loss is stationary where

    J(pi) = sum_m pi(m) s(m) - w sum_m pi(m) log(pi(m) / b(m))

is (L = -J + a constant in pi's gradient). J is strictly concave on the simplex for w > 0; with
a Lagrange multiplier lam for sum_m pi(m) = 1:

    dJ/dpi(m) = s(m) - w (log(pi(m)/b(m)) + 1) = lam
    =>  pi_w(m) = b(m) exp(s(m) / w) / Z,    Z = sum_m b(m) exp(s(m) / w)

the base tilted towards what the simulator is paid for. P4G's simulator reward is adversarial
(agents/domains/p4g/domain.py: s = 1 - r, the release's), r(m) = min(amount(m) / 2, 1) the
agent's reward, so pi_w(m) is proportional to b(m) exp(-r(m) / w): small w puts every ask's
mass on the lowest marker the base allows (ask-independent), large w leaves the base (whose best
ask is the exploit). The agent's expected reward for ask a at the equilibrium is

    E_w(a) = mean over the training personas p of sum_m pi_w(m | a, p) r(m)

and collapse3's C2 (analysis.py) asks of a co-trained simulator that the exploit is not its best
ask: margin = max over non-exploit asks of E - max over exploit asks of E >= C2_MARGIN, and
spread = max E - min E >= C2_SPREAD. The table gives, per w, each ask's E_w and whether C2
would hold at equilibrium; the registered weight comes from the window where it does.

Note what the equilibrium is not: the simulator is only trained on the prompts of asks the agent
plays, so asks it stops playing keep whatever generalisation gives them. The table is the
fixed point the exact update is pulled to on a prompt it keeps seeing; the gate (design.toml)
measures whether 16 steps get there.

    python -m training.collapse3.equilibrium [--out training/collapse3]

writes equilibrium.json and equilibrium.md (the base's exact decisions, the table, the window,
the commit it was computed at). It loads the base SmolLM2 only (a few forward passes).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# the KL weights tabulated: log-spaced over the range where the tilt moves a reward range of 1
WEIGHTS = [0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0,
           10.0]  # fmt: skip


def tilt(base: list[float], simulator_reward: list[float], weight: float) -> list[float]:
    """pi_w(m) = b(m) exp(s(m)/w) / Z: the maximiser of sum pi s - w KL(pi || b) (module
    docstring). Computed in log space (w = 0.01 with s in [0, 1] overflows exp otherwise)."""
    if weight <= 0:
        raise ValueError(f"the KL weight must be > 0, got {weight}")
    logits = [math.log(b) + s / weight if b > 0 else -math.inf
              for b, s in zip(base, simulator_reward, strict=True)]  # fmt: skip
    top = max(logits)
    unnorm = [math.exp(x - top) if x > -math.inf else 0.0 for x in logits]
    z = sum(unnorm)
    return [u / z for u in unnorm]


def objective(pi: list[float], base: list[float], simulator_reward: list[float], weight: float):
    """J(pi) = sum pi s - w sum pi log(pi / b): what the exact update maximises (tests)."""
    value = sum(p * s for p, s in zip(pi, simulator_reward, strict=True))
    kl = sum(p * math.log(p / b) for p, b in zip(pi, base, strict=True) if p > 0)
    return value - weight * kl


def adversarial(agent_reward: list[float]) -> list[float]:
    """P4G's simulator reward (sim_rewards.py, "adversarial"): s = 1 - r."""
    return [1.0 - r for r in agent_reward]


def expected_at(
    decisions: dict[str, list[dict[str, list[float]]]], weight: float | None
) -> dict[str, float]:
    """E_w(a) per ask: the mean over personas of sum_m pi_w(m) r(m) (weight None: the base).
    `decisions`: ask -> one {"probs": b(.|a, p), "rewards": r(.)} per persona."""
    out = {}
    for ask, personas in decisions.items():
        values = []
        for d in personas:
            pi = d["probs"] if weight is None else tilt(d["probs"], adversarial(d["rewards"]),
                                                        weight)  # fmt: skip
            values.append(sum(p * r for p, r in zip(pi, d["rewards"], strict=True)))
        out[ask] = statistics.fmean(values)
    return out


def table(
    decisions: dict[str, list[dict[str, list[float]]]],
    exploit: list[str],
    margin_min: float,
    spread_min: float,
    weights: list[float] = WEIGHTS,
) -> dict[str, Any]:
    """Per weight: E_w per ask, the best ask, the C2 margin and spread, and whether C2 would
    hold at the equilibrium; the window (the weights where it holds) and the registered weight
    (the window's weight with the largest margin, ties to the larger weight: nearer the base)."""
    from training.collapse3 import analysis

    rows = []
    for w in weights:
        e = expected_at(decisions, w)
        c2 = analysis.c2_at(e, exploit)
        rows.append({"weight": w, "expected": e, "best": max(e, key=e.get)} | c2)
    window = [r["weight"] for r in rows if r["holds"]]
    chosen = None
    if window:
        chosen = max((r for r in rows if r["holds"]), key=lambda r: (r["margin"], r["weight"]))
    return {
        "base_expected": expected_at(decisions, None),
        "exploit": exploit,
        "rows": rows,
        "window": window,
        "registered_weight": chosen["weight"] if chosen else None,
        "rule": "the window's weight with the largest margin, ties to the larger weight",
        "c2_margin": margin_min,
        "c2_spread": spread_min,
    }


def base_decisions(run_toml: Path) -> tuple[dict[str, Any], list[str]]:
    """The base SmolLM2 persuadee's exact decision distributions per ask x training persona
    (the run config's tasks and simulator temperature), and the frozen simulator's exploit."""
    import dataclasses

    from agents.domains import get_domain
    from agents.paths import base_model_dir
    from training.config import load_config
    from training.measures.collapse import EXPLOIT_TOLERANCE, user_decisions
    from training.rl.policy import LocalModel
    from training.rollouts.simulator import LocalUser
    from training.trainer.loop import select_scenarios

    config = load_config(run_toml)
    simulator = dataclasses.replace(config.simulator, model=str(base_model_dir().resolve()))
    config = dataclasses.replace(config, simulator=simulator)
    domain = get_domain(config.domain)
    tasks = select_scenarios(domain, config.tasks, "train")
    lm = LocalModel.load(config.simulator_model_path())
    user = LocalUser(lm, config.simulator)
    found = user_decisions(domain, tasks, user)
    decisions = {
        ask: [{"probs": list(map(float, d.probs)), "rewards": list(map(float, r)),
               "texts": list(d.texts)} for d, r in pairs]
        for ask, pairs in found.items()
    }  # fmt: skip
    # the exploit as training/measures/collapse.py defines it (simulator_exploit), from the same
    # decisions: the asks within EXPLOIT_TOLERANCE of the best base expected reward
    base = expected_at(decisions, None)
    exploit = [a for a, e in base.items() if e >= max(base.values()) - EXPLOIT_TOLERANCE]
    return decisions, exploit


def markdown(result: dict[str, Any]) -> str:
    from training.tools.experiment import _short

    asks = list(result["base_expected"])
    exploit = set(result["exploit"])
    head = " | ".join(_short(a) + (" (exploit)" if a in exploit else "") for a in asks)
    lines = [
        "# collapse3: the co-trained simulator's exact equilibrium per KL weight",
        "",
        f"Computed at commit {result['commit']} (dirty: {result['dirty']}) by "
        "`python -m training.collapse3.equilibrium` from the base SmolLM2 persuadee's exact "
        "decision probabilities (training/collapse3/equilibrium.py has the derivation: "
        "pi_w(m) proportional to b(m) exp((1 - r(m)) / w)). E = the agent's expected reward "
        "per ask at the equilibrium, mean over the training personas.",
        "",
        f"C2 at equilibrium: margin (best non-exploit E - best exploit E) >= "
        f"{result['c2_margin']} and spread (max E - min E) >= {result['c2_spread']}.",
        "",
        f"| w | {head} | best | margin | spread | C2 |",
        "|---|" + "---|" * (len(asks) + 4),
        "| base | " + " | ".join(f"{result['base_expected'][a]:.3f}" for a in asks) + " | | | | |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['weight']:g} | " + " | ".join(f"{r['expected'][a]:.3f}" for a in asks)
            + f" | {_short(r['best'])} | {r['margin']:.3f} | {r['spread']:.3f} | "
            + ("holds" if r["holds"] else "fails") + " |"
        )  # fmt: skip
    window = result["window"]
    lines += [
        "",
        f"Window (C2 holds at equilibrium): {', '.join(f'{w:g}' for w in window) or 'none'}.",
        f"Registered weight: {result['registered_weight']} ({result['rule']})."
        if window
        else "No weight satisfies C2 at equilibrium: the go/no-go gate is no-go without a pilot "
        "(design.toml, [gate]).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from training.collapse3 import analysis
    from training.tools.experiment import provenance

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(HERE), help="folder for equilibrium.json/.md")
    args = parser.parse_args(argv)
    decisions, exploit = base_decisions(HERE / "run.toml")
    result = table(decisions, exploit, analysis.C2_MARGIN, analysis.C2_SPREAD)
    found = provenance({})
    result |= {"commit": found["commit"], "dirty": found["dirty"], "decisions": decisions}
    out = Path(args.out)
    (out / "equilibrium.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "equilibrium.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
