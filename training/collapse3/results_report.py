"""collapse3's results.md and collapse3.png from results.json: the precondition, the pilots and
the gate first, then the checks, the endpoints, the verdict as analysis.py gave it, and the
secondary endpoints (which decide nothing) beside the proposal's guessed baselines."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from training.vocabulary import Regime

# the secondary endpoints' table: (label, metrics key). Every simulator turn of the decision
# episode is a decision, so the measures are the decision space's, exact. psod/training is the
# loop's PSOD against every rollout the agent met, exact/psod the runner's exact form.
SECONDARY = [
    ("SCD, probe", "behaviour/decision/probe/scd"),
    ("SCD, pooled (moves with the agent)", "behaviour/decision/pooled/scd"),
    ("BDI, probe", "behaviour/decision/probe/bdi"),
    ("PSOD (loop, training)", "psod/training"),
    ("PSOD (loop, frozen base)", "psod/base"),
    ("PSOD (exact)", "exact/psod"),
]


def _cell(values: list[Any], fmt: str = ".3f") -> str:
    numbers = [v for v in values if isinstance(v, int | float)]
    if not numbers:
        return "n/a"
    return f"{statistics.fmean(numbers):{fmt}} [{min(numbers):{fmt}}, {max(numbers):{fmt}}]"


def _mci(block: dict[str, Any], space: str) -> str:
    keys = [k for k in block if k.startswith(f"behaviour/{space}/probe/mci/")]
    return "; ".join(f"{k.rsplit('/', 1)[-1]} {_cell(block[k])}" for k in sorted(keys)) or "n/a"


def markdown(r: dict[str, Any]) -> str:
    from training.tools.experiment import _short, provenance_line

    checks, regimes, gate = r["checks"], r["regimes"], r["gate"]
    c1, c3 = checks["C1"], checks.get("C3") or {}
    lines = [
        "# collapse3: can the decision episode tell the regimes apart?",
        "",
        f"`{r['command']}`, {r['runtime_s'] / 60:.0f} minutes in all. Design: "
        "training/collapse3/design.toml and README.md, registered (registration.toml) before any "
        "run. The machine's load (`uptime`), per invocation: "
        + "; ".join(
            f"{x['seconds'] / 60:.0f} min from `{x['start']}` to `{x['end']}`" for x in r["load"]
        )
        + ".",
        "",
        provenance_line(r["provenance"]),
        "",
        f"Flat-prior agent: {r['flat_prior']['steps']} imitation steps; ask probabilities "
        f"{min(r['flat_prior']['probs']):.3f} to {max(r['flat_prior']['probs']):.3f}. Exploit "
        f"asks: {', '.join(_short(a) for a in r['precondition']['exploit'])}. Deciding panel "
        f"({', '.join(r['deciding_panel'])}): best ask "
        f"{', '.join(_short(a) for a in r['precondition']['deciding_best'])}. Equilibrium "
        f"recheck: the base persuadee's decisions within "
        f"{r['equilibrium_recheck']['max_abs_difference']:.1g} of equilibrium.json's.",
        "",
        f"Agent lr (C1 pilot, seeds {r['design']['lr_pilot']['seeds']}): "
        f"{r['lr_pilot']['lr']:g} ({r['lr_pilot']['rule']}; C1 in every pilot seed: "
        f"{r['lr_pilot']['c1_in_every_pilot_seed']}).",
        "",
    ]
    if gate["go"]:
        lines.append(
            f"Gate: **go**: simulator KL weight {gate['simulator_beta']:g}, simulator lr "
            f"{gate['simulator_lr']:g} ({gate['rule']})."
        )
    else:
        lines.append(
            f"Gate: **no-go**: {gate['why']}. The co-trained arms were not run; single and "
            "Verbalized Sampling ran on the main and the extra seeds. The precondition (a "
            "co-trained simulator whose best ask is not the exploit) could not be established "
            "at 135M."
        )
    for setting, seeds in gate.get("per_setting", {}).items():
        lines.append(
            f"- {setting}: C2 in {sum(s['holds'] for s in seeds)} of {len(seeds)} pilot seeds "
            f"(mean margin {_cell([s['mean_margin'] for s in seeds])})"
        )
    lines += [
        "",
        "## Manipulation checks",
        "",
        f"- C1 (collapse under single: p(exploit) <= 0.30 at step 1 and >= 0.80 at the end): "
        f"{'holds' if c1['holds'] else 'FAILS'} ({sum(c1['per_seed'])} of {len(c1['per_seed'])} "
        "seeds).",
    ]
    for regime in (x.value for x in Regime if x.trains_simulator):
        block = regimes.get(regime, {})
        if block.get("C2"):
            seeds = block["C2"]["per_seed"]
            lines.append(
                f"- C2 {regime} (the exploit is not the co-trained simulator's best ask, margin "
                f">= 0.02 and spread >= 0.10 at 2 of checkpoints 8, 12, 16): "
                f"{'holds' if block['C2']['holds'] else 'FAILS'} "
                f"({sum(s['holds'] for s in seeds)} of {len(seeds)} seeds; mean margin "
                f"{_cell([s['mean_margin'] for s in seeds])}, mean spread "
                f"{_cell([s['mean_spread'] for s in seeds])})."
            )
            c4 = block["C4"]
            lines.append(
                f"- C4 {regime} (the agent is steered: reward std > 0.05 in most steps): "
                f"{'holds' if c4['holds'] else 'FAILS'} (share of steps "
                f"{_cell([s['share'] for s in c4['per_seed']])})."
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
        "| regime | p(exploit) | decision entropy (nats) | what the exploit earns | "
        "held-out, deciding panel | held-out, full panel (not deciding) |",
        "|---|---|---|---|---|---|",
    ]
    for regime, block in regimes.items():
        if "p_exploit" not in block:
            continue
        lines.append(
            f"| {regime} | {_cell(block['p_exploit'])} | {_cell(block['entropy'])} | "
            f"{_cell(block['exploit_earns'])} | {_cell(block['heldout_deciding'])} | "
            f"{_cell(block['heldout_full'])} |"
        )
    lines += [
        "",
        "## Verdict (seed-paired against single)",
        "",
        "| regime | verdict | mean p(exploit) reduction | mean entropy rise | sign test p | "
        "why uninformative / not run |",
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
    guessed = r["design"]["secondary"]["guessed_baselines"]
    lines += [
        "",
        "## Secondary endpoints (decide nothing; COLLAPSE-AWARE's stage zero)",
        "",
        f"The proposal's guessed baselines: single SCD {guessed['single_scd']}, co-training SCD "
        f"{guessed['cotraining_scd']}, BDI {guessed['bdi']}, PSOD {guessed['psod']}. Measured "
        "on the fixed probe set after the last step, against P4G's human persuadees.",
        "",
        "| regime | " + " | ".join(label for label, _ in SECONDARY) + " | MCI, decision, probe |",
        "|---|" + "---|" * (len(SECONDARY) + 1),
    ]
    for regime, block in regimes.items():
        sec = block.get("secondary")
        if sec is None:
            continue
        lines.append(f"| {regime} | " + " | ".join(_cell(sec.get(k, [])) for _, k in SECONDARY)
                     + f" | {_mci(sec, 'decision')} |")  # fmt: skip
    lines += ["", "![per step](collapse3.png)", ""]
    return "\n".join(lines)


def plot(r: dict[str, Any], out: Path) -> None:
    from training.measures.figures import seed_panels

    panels = [
        ("agent/p_exploit", "p(agent asks the exploit)"),
        ("agent/decision_entropy", "agent decision entropy (nats)"),
        ("sim/decision_entropy_probe", "simulator decision entropy, probe (nats)"),
        ("reward_std", "train reward std"),
    ]
    by_key = [
        (title, {g: [x["series"][key] for x in rs if x["series"].get(key)]
                 for g, rs in r["records"].items()})
        for key, title in panels
    ]  # fmt: skip
    seed_panels(out / "collapse3.png", by_key, spread="seeds")


def write(results: dict[str, Any], out: Path) -> None:
    plot(results, out)
    (out / "results.md").write_text(markdown(results))
