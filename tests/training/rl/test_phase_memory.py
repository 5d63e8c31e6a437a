"""Each phase's memory formula (training/tools/dryrun.py) against a measurement: bench/phase_memory.py
runs 2 processes (torchrun, gloo), FSDP, full fine-tuning in bf16 mixed precision, Self-Play with
an in-process held-out member, on a tiny Llama, and measures each rank's peak per phase (the
tensors held at the phase's start plus the rise of its resident memory, glibc unmapping every
freed tensor); every figure must be within 20% of the formula for the same sizes. Slow for a
test (about 80 s on a loaded 2-core machine): two steps, a checkpoint and an evaluation in 2
processes."""

import json
import subprocess
import sys

from tests.support.processes import REPO


def test_each_phase_peak_is_within_20_percent_of_the_dry_runs_formula(tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "phase_memory.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    ratios = {
        (phase, r["rank"]): figures["measured"] / figures["formula"]
        for r in ranks
        for phase, figures in r["phases"].items()
    }
    assert set(ratios) == {
        (p, k) for p in ("rollout", "update", "checkpoint", "evaluation") for k in (0, 1)
    }
    off = {key: round(ratio, 2) for key, ratio in ratios.items() if not 0.8 <= ratio <= 1.2}
    assert not off, f"measured / formula outside 0.8..1.2: {off}\n{done.stdout}"
