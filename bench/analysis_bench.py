"""Analysis speed: 4 arms x 12 measures x 10,000 participants, end to end.

Prints seconds for building the report from a table (every arm against the
control, and all pairs with a study-wide Holm family), from a CSV file, and for
the figures. Target: the report under 2 s on the 2-core dev machine.

    .venv/bin/python bench/analysis_bench.py
"""

import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from studies.analysis import Settings, build_report, csvfile, read_csv
from studies.analysis.plots import render_all
from studies.analysis.stats import holm

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


def timed(label: str, work, repeat: int = 3):
    """Run ``work`` ``repeat`` times; print the first (cold) and the best time."""
    seconds, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        seconds.append(time.perf_counter() - start)
    print(f"{label:<56} first {seconds[0]:6.3f} s, best {min(seconds):6.3f} s of {repeat}")
    return result


def main() -> None:
    table = study_table()
    settings = Settings("arm", tuple(MEASURES), reverse=("item3",))
    all_pairs = Settings("arm", tuple(MEASURES), reverse=("item3",), pairs="all", family="study")
    print(f"{len(ARMS)} arms x {len(MEASURES)} measures x {PARTICIPANTS:,} participants")
    report = timed(
        "table -> report, each arm vs control, measure families",
        lambda: build_report(table, settings),
    )
    timed("table -> report, all pairs, one study family", lambda: build_report(table, all_pairs))
    # statsmodels' Holm runs gc.collect() per call: the per-measure families pay it 12 times.
    families = [[0.01, 0.2, 0.04]] * len(MEASURES)
    timed(
        "Holm alone: 12 families of 3 p-values (statsmodels)", lambda: [holm(f) for f in families]
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "study.csv"
        path.write_text(csvfile.table_text(table), encoding="utf-8")
        timed(
            "CSV file -> report, each arm vs control",
            lambda: build_report(read_csv(path), settings),
        )
    timed("figures as PNG (means + 10 Likert items)", lambda: render_all(report, "png"), repeat=1)
    print(
        f"comparisons: {len(report['comparisons'])}, excluded: {report['participants']['excluded']}"
    )


if __name__ == "__main__":
    main()
