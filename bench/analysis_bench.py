"""Analysis speed: 4 arms x 12 measures x 10,000 participants, end to end, before and now.

Prints, in one run and side by side, seconds for: Holm-Bonferroni by statsmodels (what the
report called before, with a gc.collect() per call) and by numpy (now), with their largest
difference over random families; the report from a table and from a CSV file with each Holm
(and whether the two reports are the same); and the figures drawn by plots.py as it was
before (read from git) and now, the first drawing in the process apart. Wall and CPU seconds:
CPU is steadier on a shared machine. The machine's load
(`uptime`) and the commit are printed beside. Targets: CSV -> report under 0.5 s and all
figures under 2 s on the 2-core dev machine.

    .venv/bin/python bench/analysis_bench.py
"""

import gc
import json
import subprocess
import tempfile
import time
import types
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from statsmodels.stats.multitest import multipletests

from studies.analysis import Settings, build_report, csvfile, plots, read_csv, stats

ARMS = ("base", "single", "verbalized", "cotrain")
PARTICIPANTS = 10_000
LIKERT = [f"item{i}" for i in range(10)]
MEASURES = [*LIKERT, "outcome", "donation"]


def study_table(seed: int = 0) -> pd.DataFrame:
    """Synthetic study: Likert answers shifted per arm, outcomes, a few gaps and failures."""
    rng = np.random.default_rng(seed)
    arm = rng.choice(ARMS, PARTICIPANTS)
    shift = pd.Series(arm).map({a: i * 0.15 for i, a in enumerate(ARMS)}).to_numpy()
    table = {"participant": np.arange(PARTICIPANTS), "arm": arm}
    for item in LIKERT:
        answers = np.clip(np.rint(rng.normal(4 + shift, 1.6)), 1, 7)
        table[item] = np.where(rng.random(PARTICIPANTS) < 0.01, np.nan, answers)
    table["outcome"] = (rng.random(PARTICIPANTS) < 0.4 + shift / 3).astype(float)
    table["donation"] = np.clip(rng.normal(0.6 + shift, 0.5), 0, 2)
    table["attention_passed"] = rng.random(PARTICIPANTS) > 0.03
    table["finished"] = rng.random(PARTICIPANTS) > 0.02
    return pd.DataFrame(table)


def statsmodels_holm(pvalues) -> np.ndarray:
    """stats.holm as it was: statsmodels on the finite p-values, NaN elsewhere."""
    p = np.asarray(pvalues, dtype=float)
    adjusted = np.full(p.shape, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        adjusted[finite] = multipletests(p[finite], method="holm")[1]
    return adjusted


# The figures as they were drawn before this work: plots.py at that commit, read from git.
FIGURES_BEFORE = "7775a4a"


def plots_before():
    """studies/analysis/plots.py at FIGURES_BEFORE as a module beside today's, or None."""
    found = subprocess.run(
        ["git", "show", f"{FIGURES_BEFORE}:studies/analysis/plots.py"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    if found.returncode:
        return None
    module = types.ModuleType("studies.analysis.plots_before")
    module.__package__ = "studies.analysis"  # its relative imports are today's plan and report
    exec(compile(found.stdout, f"plots.py@{FIGURES_BEFORE}", "exec"), module.__dict__)
    return module


def seconds(work, repeat: int) -> tuple[list[tuple[float, float]], object]:
    """(wall, CPU) seconds of each of ``repeat`` runs: CPU time is steadier on a busy machine."""
    taken, result = [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        taken.append((time.perf_counter() - wall, time.process_time() - cpu))
    return taken, result


def side_by_side(label: str, before, now, repeat: int = 3):
    """Run the old and the new way alternately; print both (best of ``repeat``) and the ratio."""
    old, new = [], []
    for _ in range(repeat):
        old += seconds(before, 1)[0]
        new += seconds(now, 1)[0]
    old_wall, new_wall = min(w for w, _ in old), min(w for w, _ in new)
    cpu_old, cpu_new = min(c for _, c in old), min(c for _, c in new)
    print(
        f"{label:<44} before {old_wall:7.4f} s  now {new_wall:7.4f} s  "
        f"now/before {new_wall / old_wall:5.3f}  | CPU before {cpu_old:7.4f} s  "
        f"now {cpu_new:7.4f} s  (best of {repeat}, {time.strftime('%H:%M:%S')})"
    )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def commit() -> str:
    found = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return found.stdout.strip() or "unknown"


def holm_difference(families: int = 200) -> float:
    rng = np.random.default_rng(1)
    worst = 0.0
    with mock.patch.object(gc, "collect", lambda *args: 0):
        for _ in range(families):
            p = rng.random(int(rng.integers(1, 40))) ** 3
            worst = max(worst, float(np.abs(stats.holm(p) - statsmodels_holm(p)).max()))
    return worst


def main() -> None:
    print(f"commit {commit()}; uptime before: {uptime()}")
    table = study_table()
    settings = Settings("arm", tuple(MEASURES), reverse=("item3",))
    all_pairs = Settings("arm", tuple(MEASURES), reverse=("item3",), pairs="all", family="study")
    print(f"{len(ARMS)} arms x {len(MEASURES)} measures x {PARTICIPANTS:,} participants")
    old_holm = mock.patch.object(stats, "holm", statsmodels_holm)

    def before(work):
        def run():
            with old_holm:
                return work()

        return run

    # statsmodels' Holm runs gc.collect() per call: the per-measure families pay it 12 times.
    families = [[0.01, 0.2, 0.04]] * len(MEASURES)
    side_by_side(
        "Holm alone: 12 families of 3 p-values",
        lambda: [statsmodels_holm(f) for f in families],
        lambda: [stats.holm(f) for f in families],
    )
    print(f"largest |numpy - statsmodels| over 200 random families: {holm_difference():.1e}")
    report = build_report(table, settings)
    same = json.dumps(before(lambda: build_report(table, settings))()) == json.dumps(report)
    print(f"report with statsmodels' Holm == report with numpy's: {same}")
    side_by_side(
        "table -> report, each arm vs control",
        before(lambda: build_report(table, settings)),
        lambda: build_report(table, settings),
    )
    side_by_side(
        "table -> report, all pairs, one study family",
        before(lambda: build_report(table, all_pairs)),
        lambda: build_report(table, all_pairs),
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.csv"
        path.write_text(csvfile.table_text(table), encoding="utf-8")
        side_by_side(
            "CSV file -> report, each arm vs control",
            before(lambda: build_report(read_csv(path), settings)),
            lambda: build_report(read_csv(path), settings),
        )
    # The first drawing in a process also loads fonts and fills matplotlib's text caches.
    [(wall, cpu)], drawn = seconds(lambda: plots.render_all(report, "png"), 1)
    label = f"{len(drawn)} figures as PNG, first in this process (now)"
    print(f"{label:<44} {wall:7.3f} s, CPU {cpu:7.3f} s")
    before_plots = plots_before()
    if before_plots is None:
        print(f"(no git history: figures of {FIGURES_BEFORE} not drawn)")
    for fmt in ("png", "svg"):
        if before_plots is None:
            [(wall, cpu)], _ = seconds(lambda fmt=fmt: plots.render_all(report, fmt), 1)
            print(f"{f'figures as {fmt.upper()} (now)':<44} {wall:7.3f} s, CPU {cpu:7.3f} s")
            continue
        side_by_side(
            f"figures as {fmt.upper()}, {FIGURES_BEFORE} vs now",
            lambda fmt=fmt: before_plots.render_all(report, fmt),
            lambda fmt=fmt: plots.render_all(report, fmt),
        )
    print(
        f"comparisons: {len(report['comparisons'])}, excluded: {report['participants']['excluded']}"
    )
    print(f"uptime after: {uptime()}")


if __name__ == "__main__":
    main()
