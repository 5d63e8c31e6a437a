"""The run's metrics.jsonl (one JSON row per step) and the plots drawn from it.

On resume, rows from steps after the checkpoint are moved to <name>.discarded.jsonl (those
steps are trained again), so metrics.jsonl stays one row per step and nothing is lost. The same
log keeps samples.jsonl, one sampled conversation per task and step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from training.layout import METRICS_FILE, SAMPLES_FILE

PLOTS = (
    "train_reward.png",
    "heldout_success.png",
    "entropy.png",
    "collapse.png",
    "diversity.png",
    "behaviour.png",  # only for a run with behaviour profiles ([behaviour])
)


class MetricsLog:
    def __init__(self, path: Path, resume_step: int = 0):
        self.path = Path(path)
        rows = self.rows()
        stale = [r for r in rows if r.get("step", 0) > resume_step]
        if stale:
            with open(self.path.with_suffix(".discarded.jsonl"), "a") as f:
                for row in stale:
                    f.write(json.dumps(row) + "\n")
            kept = [r for r in rows if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def write(self, row: dict[str, Any]) -> None:
        self.write_many([row])

    def write_many(self, rows: Iterable[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            for row in rows:
                f.write(json.dumps(row, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    return float(value) if hasattr(value, "__float__") else str(value)


def plot(rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """train_reward.png, heldout_success.png (one line per held-out simulator), entropy.png,
    collapse.png (training/measures/collapse.py's measures, where the task has them) and diversity.png
    (training/measures/diversity.py's: the replies' distinct-n, the top opening's share)."""
    from matplotlib.ticker import MaxNLocator

    from training.measures.figures import figure, save

    def series(key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in rows if _finite(r.get(key))]
        return [p[0] for p in points], [p[1] for p in points]

    panels = {
        "train_reward.png": ("train reward", {"mean reward": "reward_mean"}),
        "heldout_success.png": (
            "held-out success rate",
            {
                k.split("/")[1]: k
                for k in sorted({k for r in rows for k in r})
                if k.startswith("heldout/") and k.endswith("/success") and k.count("/") == 2
            },
        ),
        "entropy.png": (
            "policy entropy (nats/token)",
            {"train": "entropy", "held-out": "heldout/entropy"},
        ),
        "collapse.png": (
            "collapse: exploit probability, decision entropies (nats), reward variance",
            {
                "p(agent asks the exploit)": "agent/p_exploit",
                "agent decision entropy": "agent/decision_entropy",
                "simulator decision entropy": "sim/decision_entropy",
                "reward variance: simulator": "reward_var/simulator",
                "reward variance: agent": "reward_var/agent",
            },
        ),
        "diversity.png": (
            "reply diversity: distinct-n, top opening share",
            {
                "simulator distinct-1": "sim/distinct_1",
                "simulator distinct-2": "sim/distinct_2",
                "simulator top opening share": "sim/top_opening_share",
                "simulator embedding dispersion": "sim/embedding_dispersion",
                "agent distinct-1": "agent/distinct_1",
                "agent distinct-2": "agent/distinct_2",
            },
        ),
    }
    behaviour = behaviour_lines(rows)
    if behaviour:
        panels["behaviour.png"] = (
            "behaviour profiles: MCI, SCD, BDI on the fixed probe set (pooled beside), PSOD",
            behaviour,
        )
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for filename, (title, lines) in panels.items():
        fig, (ax,) = figure(6, 3.5)
        for label, key in lines.items():
            x, y = series(key)
            if x:
                ax.plot(x, y, marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize=8)
        written.append(save(fig, folder / filename))
    return written


def behaviour_lines(rows: list[dict[str, Any]]) -> dict[str, str]:
    """behaviour.png's lines (training/measures/profiles.py's keys): per space, the probe MCI of
    each simulator, SCD and BDI (or the relative coverage growth) on the probe set and pooled,
    and PSOD of each named training simulator, and the breaker's level and synthesis share
    where [breaker] is on; intervals stay in metrics.jsonl."""
    keys = sorted({k for r in rows for k in r})
    lines = {}
    for key in keys:
        parts = key.split("/")
        if parts[0] == "psod" and len(parts) == 2:
            lines[f"PSOD vs {parts[1]}"] = key
        elif key == "breaker/level":  # [breaker]: where it stood beside what it judged
            lines["breaker level (0 green, 1 yellow, 2 red)"] = key
        elif key == "breaker/synthesis_share":
            lines["synthesis share (breaker)"] = key
        elif parts[0] != "behaviour" or len(parts) < 4 or parts[-1] in ("lo", "hi"):
            continue
        elif parts[3] == "mci" and parts[2] == "probe" and len(parts) == 5:
            lines[f"{parts[1]} MCI {parts[4]}"] = key
        elif parts[3] in ("scd", "bdi", "coverage_growth") and len(parts) == 4:
            pooled = " (pooled)" if parts[2] == "pooled" else ""
            name = {"coverage_growth": "coverage growth (relative)"}.get(parts[3], parts[3].upper())
            lines[f"{parts[1]} {name}{pooled}"] = key
    return lines


def behaviour_now(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The last logged value of each behaviour.png line, with its interval where it is an
    estimate, and the step it is from (the run page's table)."""
    found = []
    for label, key in behaviour_lines(rows).items():
        row = next((r for r in reversed(rows) if _finite(r.get(key))), None)
        if row is None:
            continue
        value = f"{row[key]:.3f}"
        if _finite(row.get(f"{key}/lo")) and _finite(row.get(f"{key}/hi")):
            value += f" [{row[key + '/lo']:.3f}, {row[key + '/hi']:.3f}]"
        found.append((label, f"{value} (step {row.get('step', '?')})"))
    return found


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a .jsonl file as they are now, without touching it (MetricsLog moves stale
    rows away, which only the run itself may do); a line still being written is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def run_summary(run_dir: Path | str, samples: int = 3) -> dict[str, Any]:
    """What a run's folder shows a researcher: its plots (PNG files beside metrics.jsonl), the
    last `samples` sampled conversations, the steps logged and the optimizer steps taken (0
    after a logged step: the adapter is still the base model)."""
    folder = Path(run_dir)
    rows = read_rows(folder / METRICS_FILE)
    return {
        "plots": sorted(p.name for p in folder.glob("*.png") if p.is_file())
        if folder.is_dir()
        else [],
        "samples": read_rows(folder / SAMPLES_FILE)[-samples:] if samples else [],
        "steps_logged": len(rows),
        "behaviour": behaviour_now(rows),
        "optimizer_steps": int(sum(_number(r.get("optimizer_step")) for r in rows)),
    }


def _number(value: Any) -> float:
    return float(value) if _finite(value) else 0.0
