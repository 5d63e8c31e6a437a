"""The sim-to-real gap of a study, without Django: each arm's checkpoint against the training
run's held-out simulators beside the same arm with people.

    report = build_sim2real([ArmData("a", "run-step8", simulated=[...], outcome=[...], ...)])

Every interval is a t-interval of a mean at ``ci_level`` over the values it summarises
(mean +- t_{(1+level)/2, n-1} * SD / sqrt(n), ``stats.describe``): for simulators the values are
the arm's conversations with every held-out simulator pooled; for success (0/1) that is the
Wald interval with t in place of z. The gap is simulator minus human on the common measure (the
Domain's reward against the human outcome, and success against human success), with Welch's
interval of a difference of means (``stats.welch``): simulator and human values are independent
samples of different sizes and variances.

Report keys (format ``parley.sim2real/1``): ``ci_level``, ``interval`` (the interval in words),
``errors`` (nothing compared when non-empty), ``notes``, ``arms`` (list of ``{name, checkpoint,
simulators: {name: {n, success, reward}}, simulated: {n, success, reward}, human: {n, outcome,
success}, likert: {item: {label, ...descriptives}}, gap: {reward, success}}``, each descriptive
``{n, mean, sd, se, ci: [low, high], note}`` and each gap ``{diff, ci: [low, high], note}``),
``ranking`` (``{measure, simulators: [arm, ...], people: [arm, ...], arms, tau, p, note}``,
best first; Kendall's tau-b between the arms' simulator reward means and human outcome means,
scipy's two-sided p-value). A statistic that is not finite is null and its ``note`` says why.

Human-like simulators (fine-tuned on a study's people, issue 14 point 5) are columns of their own,
never pooled into the training panel's ``simulated``: ``humanlike`` lists them (``{name,
label, ranking}``: the arms ranked by it against people, shaped as ``ranking``), and each arm has ``humanlike: [{name, label, n, success, reward, gap: {reward,
success}}, ...]`` in that order (a list: a stored report's JSON objects keep no key order), its
gap to people computed as the panel's is.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from . import stats
from .report import finite, measure_label
from .sim2real_behaviour import format_behaviour

FORMAT = "parley.sim2real/1"
MEASURES = ("success", "reward")  # what a held-out simulator conversation is scored on


@dataclass(frozen=True)
class Conversation:
    """One scored conversation of an arm's checkpoint with a held-out simulator."""

    simulator: str
    success: bool
    reward: float


@dataclass
class ArmData:
    """An arm's inputs: its simulated conversations, and its included participants' values
    (outcome = the Domain's reward of each person's conversation; Likert items as analysed,
    reverse-coded ones flipped)."""

    name: str
    checkpoint: str | None = None
    simulated: Sequence[Conversation] = ()
    outcome: Sequence[float] = ()
    success: Sequence[float] = ()
    likert: dict[str, Sequence[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # conversations with human-like simulators, kept apart from the training run's panel
    humanlike: Sequence[Conversation] = ()


def interval_words(ci_level: float) -> str:
    return (
        f"{ci_level:.0%} t-interval of the mean (mean ± t(n−1) · SD/√n); the gap's is Welch's "
        "interval of the difference"
    )


def descriptives(values: Sequence[float], ci_level: float) -> dict[str, Any]:
    summary = stats.describe(np.asarray(values, dtype=float), ci_level)
    entry = {
        "n": summary.n,
        "mean": finite(summary.mean),
        "sd": finite(summary.sd),
        "se": finite(summary.se),
        "ci": [finite(v) for v in summary.ci],
        "note": summary.note,
    }
    return entry


def gap(simulated: Sequence[float], human: Sequence[float], ci_level: float) -> dict[str, Any]:
    """Simulator minus human: the difference of means and Welch's interval of it."""
    if not len(simulated) or not len(human):
        side = "simulator conversations" if not len(simulated) else "participants"
        return {"diff": None, "ci": [None, None], "note": f"no {side}"}
    test = stats.welch(np.asarray(simulated, float), np.asarray(human, float), ci_level)
    ci = [finite(v) for v in test.diff_ci]
    note = test.note if None in ci else None
    return {"diff": finite(test.diff), "ci": ci, "note": note}


def kendall(simulated: Sequence[float], human: Sequence[float]) -> tuple[float, float]:
    """Kendall's tau-b and its two-sided p-value (scipy), NaN when undefined."""
    with warnings.catch_warnings():  # a constant ranking is a note, not a warning
        warnings.simplefilter("ignore")
        result = scipy_stats.kendalltau(simulated, human)
    return float(result.statistic), float(result.pvalue)


def ranked(means: dict[str, float]) -> list[str]:
    """Arms best first (highest mean; ties keep the study's order)."""
    return sorted(means, key=lambda arm: -means[arm])


def panel_reward(arm: dict[str, Any]) -> float | None:
    return arm["simulated"]["reward"]["mean"]


def humanlike_reward(name: str):
    """An arm's mean reward with one human-like simulator."""
    return lambda arm: next(h["reward"]["mean"] for h in arm["humanlike"] if h["name"] == name)


def ranking(
    arms: list[dict[str, Any]], simulated=panel_reward, side: str = "simulators"
) -> dict[str, Any]:
    """The arms by mean simulator reward (`simulated` picks it: the run's panel pooled, or one
    human-like simulator) and by mean human outcome, and how far they agree."""
    both = [
        a for a in arms if simulated(a) is not None and a["human"]["outcome"]["mean"] is not None
    ]
    entry: dict[str, Any] = {
        "measure": f"reward ({side}) against outcome (people)",
        "simulators": ranked({a["name"]: simulated(a) for a in both}),
        "people": ranked({a["name"]: a["human"]["outcome"]["mean"] for a in both}),
        "arms": len(both),
        "tau": None,
        "p": None,
        "note": None,
    }
    left_out = [a["name"] for a in arms if a not in both]
    if len(both) < 2:
        entry["note"] = (
            f"Kendall's tau needs at least 2 arms with both simulator conversations and "
            f"participant outcomes; {len(both)} have both"
            + (f" ({', '.join(left_out)} lack one)" if left_out else "")
        )
        return entry
    tau, p = kendall(
        [simulated(a) for a in both],
        [a["human"]["outcome"]["mean"] for a in both],
    )
    entry["tau"], entry["p"] = finite(tau), finite(p)
    notes = []
    if entry["tau"] is None:
        notes.append("tau undefined: every arm has the same mean on one side (no ranking)")
    if left_out:
        notes.append(f"arms without both sides left out: {', '.join(left_out)}")
    entry["note"] = "; ".join(notes) or None
    return entry


def humanlike_entry(arm: ArmData, name: str, label: str, ci_level: float) -> dict[str, Any]:
    """One human-like simulator's column of an arm: its conversations and their gap to people."""
    rows = [c for c in arm.humanlike if c.simulator == name]
    success = [float(c.success) for c in rows]
    reward = [float(c.reward) for c in rows]
    return {
        "name": name,
        "label": label,
        "n": len(rows),
        "success": descriptives(success, ci_level),
        "reward": descriptives(reward, ci_level),
        "gap": {
            "reward": gap(reward, arm.outcome, ci_level),
            "success": gap(success, arm.success, ci_level),
        },
    }


def arm_entry(
    arm: ArmData, ci_level: float, reverse: Sequence[str], humanlike: dict[str, str]
) -> dict[str, Any]:
    by_simulator: dict[str, list[Conversation]] = {}
    for c in arm.simulated:
        by_simulator.setdefault(c.simulator, []).append(c)
    success = [float(c.success) for c in arm.simulated]
    reward = [float(c.reward) for c in arm.simulated]
    return {
        "name": arm.name,
        "checkpoint": arm.checkpoint,
        "simulators": {
            name: {
                "n": len(rows),
                "success": descriptives([float(c.success) for c in rows], ci_level),
                "reward": descriptives([c.reward for c in rows], ci_level),
            }
            for name, rows in by_simulator.items()
        },
        "simulated": {
            "n": len(reward),
            "success": descriptives(success, ci_level),
            "reward": descriptives(reward, ci_level),
        },
        "human": {
            "n": len(arm.outcome),
            "outcome": descriptives(arm.outcome, ci_level),
            "success": descriptives(arm.success, ci_level),
        },
        "likert": {
            item: {"label": measure_label(item, item in reverse), **descriptives(v, ci_level)}
            for item, v in arm.likert.items()
        },
        "gap": {
            "reward": gap(reward, arm.outcome, ci_level),
            "success": gap(success, arm.success, ci_level),
        },
        "humanlike": [
            humanlike_entry(arm, name, label, ci_level) for name, label in humanlike.items()
        ],
        "notes": list(arm.notes),
    }


def build_sim2real(
    arms: Sequence[ArmData],
    ci_level: float = 0.95,
    reverse: Sequence[str] = (),
    humanlike: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The gap report (see the module docstring) of these arms, in the study's order;
    `humanlike` names the human-like simulators to show as columns (name -> label)."""
    humanlike = dict(humanlike or {})
    report: dict[str, Any] = {
        "format": FORMAT,
        "ci_level": ci_level,
        "interval": interval_words(ci_level),
        "errors": [],
        "notes": [],
        "arms": [],
        "ranking": None,
        "humanlike": [{"name": name, "label": label} for name, label in humanlike.items()],
    }
    if not 0 < ci_level < 1:
        report["errors"].append(f"ci_level must lie strictly between 0 and 1, not {ci_level}")
        return report
    if not arms:
        report["errors"].append("the study has no arms")
        return report
    report["arms"] = [arm_entry(arm, ci_level, reverse, humanlike) for arm in arms]
    report["ranking"] = ranking(report["arms"])
    for like in report["humanlike"]:  # does it rank the arms as people do, where the panel may not
        like["ranking"] = ranking(report["arms"], humanlike_reward(like["name"]), like["label"])
    for arm in report["arms"]:
        if not arm["simulated"]["n"]:
            report["notes"].append(f"arm {arm['name']!r}: no simulator conversations stored")
        if not arm["human"]["n"]:
            report["notes"].append(f"arm {arm['name']!r}: no included participant outcomes")
    if len(arms) < 2:
        report["notes"].append(f"only one arm ({arms[0].name!r}): no ranking to compare")
    return report


def _mean_ci(d: dict[str, Any]) -> str:
    if d["mean"] is None:
        return "n/a"
    low, high = d["ci"]
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
    return f"{d['mean']:.3f}{interval} (n={d['n']})"


def _gap_lines(gaps: dict[str, Any], side: str) -> list[str]:
    lines = []
    for measure, g in gaps.items():
        if g["diff"] is None:
            lines.append(f"  gap in {measure} ({side} - people): n/a ({g['note']})")
        else:
            low, high = g["ci"]
            interval = f" [{low:.3f}, {high:.3f}]" if low is not None else ""
            lines.append(f"  gap in {measure} ({side} - people): {g['diff']:+.3f}{interval}")
    return lines


def format_sim2real(report: dict[str, Any]) -> str:
    """The report as text for a terminal: one block per arm, then the ranking."""
    lines = [f"Sim-to-real gap of {report.get('study', 'the study')} ({report['interval']})"]
    lines += [f"error: {e}" for e in report["errors"]]
    for arm in report["arms"]:
        lines.append(f"\narm {arm['name']} (checkpoint {arm['checkpoint'] or 'none'})")
        for name, sim in arm["simulators"].items():
            lines.append(
                f"  simulator {name}: success {_mean_ci(sim['success'])}, "
                f"reward {_mean_ci(sim['reward'])}"
            )
        sim, human = arm["simulated"], arm["human"]
        lines.append(
            f"  all simulators: success {_mean_ci(sim['success'])}, reward {_mean_ci(sim['reward'])}"
        )
        lines.append(
            f"  people: success {_mean_ci(human['success'])}, outcome {_mean_ci(human['outcome'])}"
        )
        for d in arm["likert"].values():
            lines.append(f"  people, {d['label']}: {_mean_ci(d)}")
        lines += _gap_lines(arm["gap"], "simulators")
        for like in arm.get("humanlike", []):
            lines.append(
                f"  {like['label']}: success {_mean_ci(like['success'])}, "
                f"reward {_mean_ci(like['reward'])}"
            )
            lines += _gap_lines(like["gap"], like["label"])
    ranking = report.get("ranking")
    if ranking:
        lines.append(f"\nranking by simulators: {', '.join(ranking['simulators']) or '-'}")
        lines.append(f"ranking by people:     {', '.join(ranking['people']) or '-'}")
        if ranking["tau"] is not None:
            lines.append(
                f"Kendall's tau = {ranking['tau']:.3f}, p = {ranking['p']:.4g} ({ranking['arms']} arms)"
            )
        if ranking["note"]:
            lines.append(f"note: {ranking['note']}")
    for rated in report.get("annotation") or []:
        lines.append(f"\nrated in annotation study {rated['study']} ({rated['quality']}):")
        for arm, sources in rated["arms"].items():
            for source, d in sources.items():
                real = d["realism"]
                lines.append(
                    f"  {arm}, {source}: {_mean_ci(d['quality'])}"
                    + (f", judged a real person {real['rate']:.2f} of {real['n']}" if real else "")
                )
        r = rated["ranking"]
        taus = [(k, r[f"against_{k}"]["tau"]) for k in ("participants", "simulators")]
        lines.append(
            f"ranking by raters: {', '.join(r['raters']) or '-'}; Kendall's tau-b "
            + ", ".join(
                f"against {k} {t:.3f}" if t is not None else f"against {k} n/a" for k, t in taus
            )
        )
    for like in report.get("humanlike") or []:
        r = like["ranking"]
        tau = f"Kendall's tau = {r['tau']:.3f}, p = {r['p']:.4g}" if r["tau"] is not None else ""
        lines.append(
            f"ranking by {like['label']}: {', '.join(r['simulators']) or '-'}"
            + (f"; {tau}" if tau else "")
            + (f" (note: {r['note']})" if r["note"] else "")
        )
    lines += format_behaviour(report.get("behaviour"))
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)
