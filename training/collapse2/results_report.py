"""collapse2's results.md and collapse2.png from results.json: the checks first, then the
endpoints, then the verdict as analysis.py gave it."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from training.vocabulary import Regime


def _cell(values: list[float], fmt: str = ".3f") -> str:
    if not values:
        return "n/a"
    return f"{statistics.fmean(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def markdown(r: dict[str, Any]) -> str:
    from training.tools.experiment import _short, provenance_line

    checks, regimes = r["checks"], r["regimes"]
    c1 = checks["C1"]
    c3 = checks.get("C3") or {}
    lines = [
        "# collapse2: can the decision episode tell the regimes apart?",
        "",
        f"`{r['command']}`, {r['runtime_s'] / 60:.0f} minutes in all. Design: "
        "training/collapse2/design.toml and README.md, committed before any run.",
        "",
        provenance_line(r["provenance"]),
        "",
        f"Flat-prior agent: {r['flat_prior']['steps']} imitation steps; its ask probabilities "
        f"{min(r['flat_prior']['probs']):.3f} to {max(r['flat_prior']['probs']):.3f} (SmolLM2's "
        f"own: {min(r['flat_prior']['probs_before']):.3f} to "
        f"{max(r['flat_prior']['probs_before']):.3f}). Exploit asks (the frozen simulator's "
        f"best): {', '.join(_short(a) for a in r['precondition']['exploit'])}. Deciding panel "
        f"({', '.join(r['deciding_panel'])}): best ask "
        f"{', '.join(_short(a) for a in r['precondition']['deciding_best'])}.",
        "",
        f"Pilot (seeds {r['design']['pilot']['seeds']}, cotrain, judged on C2 only): simulator "
        f"KL weight {r['pilot']['simulator_beta']:g} chosen ({r['pilot']['rule']}).",
        "",
        "## Manipulation checks",
        "",
        f"- C1 (collapse under single: p(exploit) <= 0.30 at step 1 and >= 0.80 at the end): "
        f"{'holds' if c1['holds'] else 'FAILS'} ({sum(c1['per_seed'])} of {len(c1['per_seed'])} "
        "seeds).",
    ]
    for regime in (r.value for r in Regime if r.trains_simulator):
        block = regimes.get(regime, {}).get("C2")
        if block:
            seeds = block["per_seed"]
            lines.append(
                f"- C2 {regime} (the final simulator pays the agent's policy >= 0.05 below its "
                f"best ask, and its asks' rewards spread >= 0.10): {'holds' if block['holds'] else 'FAILS'} "
                f"({sum(s['holds'] for s in seeds)} of {len(seeds)} seeds; punish "
                f"{_cell([s.get('punish', float('nan')) for s in seeds])}, spread "
                f"{_cell([s.get('spread', float('nan')) for s in seeds])})."
            )
    if c3:
        lines.append(
            f"- C3 (Verbalized Sampling's written distribution differs from the plain one, mean "
            f"TV >= 0.10): {'holds' if c3['holds'] else 'FAILS'} (mean TV {c3['mean_tv']:.3f} "
            f"over {c3['pairs']} persona x ask pairs)."
        )
    lines += [
        "",
        "## Endpoints (after the last step; mean [min, max] over seeds)",
        "",
        "| regime | p(exploit) | decision entropy (nats) | held-out, deciding panel | "
        "held-out, full panel (not deciding) |",
        "|---|---|---|---|---|",
    ]
    for regime, block in regimes.items():
        if "p_exploit" not in block:
            continue
        lines.append(
            f"| {regime} | {_cell(block['p_exploit'])} | {_cell(block['entropy'])} | "
            f"{_cell(block['heldout_deciding'])} | {_cell(block['heldout_full'])} |"
        )
    lines += [
        "",
        "## Verdict (seed-paired against single)",
        "",
        "| regime | verdict | mean p(exploit) reduction | mean entropy rise | sign test p | "
        "why uninformative |",
        "|---|---|---|---|---|---|",
    ]
    for regime, block in regimes.items():
        if regime == Regime.SINGLE:
            continue
        paired = block.get("paired") or {}
        lines.append(
            f"| {regime} | **{block['verdict']}** | "
            f"{paired.get('mean_p_exploit_reduction', float('nan')):.3f} | "
            f"{paired.get('mean_entropy_rise', float('nan')):.3f} | "
            f"{paired.get('sign_test_p', float('nan')):.3f} | "
            f"{'; '.join(block.get('uninformative_because') or []) or '-'} |"
        )
    lines += ["", "![per step](collapse2.png)", ""]
    return "\n".join(lines)


def plot(r: dict[str, Any], out: Path) -> None:
    from training.measures.figures import seed_panels

    panels = [
        ("agent/p_exploit", "p(agent asks the exploit)"),
        ("agent/decision_entropy", "agent decision entropy (nats)"),
        ("sim/decision_entropy", "simulator decision entropy (nats)"),
        ("reward_mean", "train reward"),
    ]
    by_key = [
        (
            title,
            {
                g: [x["series"][key] for x in rs if x["series"].get(key)]
                for g, rs in r["records"].items()
            },
        )
        for key, title in panels
    ]
    seed_panels(out / "collapse2.png", by_key, spread="seeds")


def write(results: dict[str, Any], out: Path) -> None:
    plot(results, out)
    (out / "results.md").write_text(markdown(results))
