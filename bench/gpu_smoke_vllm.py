"""Full fine-tuning with rollouts on vLLM and weight sync, on one GPU: the smoke check of
training/rollouts/weight_sync.py's GPU path (bench/gpu_smoke.sh calls it).

    python bench/gpu_smoke_vllm.py [--model DIR] [--steps 2] [--dtype bfloat16]
                                   [--backend ipc] [--gpu-share 0.3] [--out DIR]

Where vllm does not import (the lent device has no vLLM, and its wheel is more than a device
call can carry) it prints that vLLM is not on this device and exits 0. Where it does: it starts
vLLM's OpenAI server on the same GPU (--gpu-memory-utilization `--gpu-share`, the trainer
keeping the rest) with --weight-transfer-config naming `--backend`, trains the agent on P4G
(the CPU config's episode, finetune = "full", mixed precision in `--dtype`, rollouts on the
server, no held-out panel) for `--steps` steps, and checks what the issue asks of it: every
agent turn of step N carries the version pushed before it, and the server ends on the last
one. One GPU means the server shares the trainer's device: "ipc" (vLLM's CUDA IPC engine)
is the backend for that; "nccl" (vLLM's NCCL engine, the default between GPUs) needs the server
on another GPU, since NCCL refuses two ranks on one device. Prints, per step, the rollout,
push and step seconds and the agent's tokens/s, vLLM's start, and the trainer's peak GPU
memory; writes results.json under --out; exits non-zero if a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "platform")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("PARLEY_BASE_MODEL", ""))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--backend", default="ipc", choices=["ipc", "nccl"])
    parser.add_argument("--gpu-share", type=float, default=0.3, help="vLLM's share of the GPU")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "smoke-vllm")
    args = parser.parse_args()

    if importlib.util.find_spec("vllm") is None:
        print("gpu_smoke_vllm: vLLM is not on this device (vllm does not import): not run")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke_vllm: no CUDA device here: not run")
        return 0
    if not args.model:
        parser.error("--model (or PARLEY_BASE_MODEL): a Hugging Face model folder")

    from agents.serving.launch import stop_engine
    from agents.serving.vllm import start_vllm
    from training.config import load_config
    from training.rollouts import agent as agent_module
    from training.rollouts import weight_sync
    from training.trainer import loop

    pushes: list[float] = []
    push = weight_sync.ServedWeights.push

    def timed(server, weights, version):
        t0 = time.perf_counter()
        push(server, weights, version)
        torch.cuda.synchronize()
        pushes.append(time.perf_counter() - t0)

    weight_sync.ServedWeights.push = timed
    versions: list[tuple[str, ...]] = []

    class Recording(agent_module.WeightSyncedAgent):
        def respond(self, domain, rollouts):
            super().respond(domain, rollouts)
            versions.extend(tuple(r.agent.weight_versions[-1:]) for r in rollouts)

    loop.WeightSyncedAgent = Recording

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    url, process = start_vllm(
        args.model,
        python=sys.executable,
        dtype=args.dtype,
        max_model_len=4096,
        weight_transfer=args.backend,
        tool_call_parser=None,
        extra_args=["--gpu-memory-utilization", str(args.gpu_share)],
        log_path=args.out / "vllm.log",
    )
    started = time.perf_counter() - t0
    rows: list[dict] = []
    failures: list[str] = []
    try:
        config = load_config(
            REPO / "training/configs/p4g-single-cpu.toml",
            {
                "name": "smoke-vllm",
                "base_model": args.model,
                "finetune": "full",
                "device": "cuda",
                "dtype": args.dtype,
                "mixed_precision": True,
                "steps": args.steps,
                "heldout": [],
                "eval_every": 10_000,
                "save_every": 10_000,
                "threads": 0,
                "rollout_endpoint": url,
                "weight_sync_backend": args.backend,
                "output_dir": str(args.out / "run"),
            },
        )
        torch.cuda.reset_peak_memory_stats()
        loop.train(
            config, progress_callback=lambda p: rows.append(p["metrics"]), show_progress=False
        )
        served = weight_sync.WeightSyncClient(url).weight_version()
        last = f"smoke-vllm-live-{args.steps - 1}"
        if served != last:
            failures.append(f"the server holds version {served!r}, not {last!r}")
        expected = {(f"smoke-vllm-live-{s}",) for s in range(args.steps)}
        if not versions or set(versions) - expected:
            failures.append(f"turns' versions {sorted(set(versions))}, expected {sorted(expected)}")
    except Exception as error:  # printed, then the exit status says it failed
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        stop_engine(process, timeout=30)
        weight_sync.ServedWeights.push = push

    print(
        f"device: {torch.cuda.get_device_name()}; backend {args.backend}; vLLM start {started:.0f} s"
    )
    print(f"{'step':>4} {'rollout s':>9} {'push s':>7} {'step s':>7} {'agent tok/s':>11}")
    for i, row in enumerate(rows):
        rate = row.get("tokens", 0.0) / row["time_rollout"] if row["time_rollout"] else 0.0
        push_s = pushes[i] if i < len(pushes) else float("nan")
        print(
            f"{row['step']:>4} {row['time_rollout']:>9.2f} {push_s:>7.2f}"
            f" {row['time_step']:>7.2f} {rate:>11.1f}"
        )
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"trainer's peak GPU memory: {peak:.2f} GiB (vLLM's share apart: {args.gpu_share})")
    results = {
        "rows": rows,
        "pushes": pushes,
        "vllm_start": started,
        "peak_gib": peak,
        "failures": failures,
        "backend": args.backend,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
