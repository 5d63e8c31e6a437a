"""Each phase's per-rank memory peak, measured, beside the dry run's formula for the same sizes
(training/tools/dryrun.py `memory`): rollout, update, checkpoint, evaluation.

    python bench/phase_memory.py [--out FIGURES.json]      # launches 2 processes itself

The run: 2 processes (torchrun, gloo on CPU), FSDP, full fine-tuning, bfloat16 mixed precision,
Self-Play (regime "cotrain": the simulator a second trained Policy), P4G free text, an
in-process held-out simulator (another tiny model), on a tiny Llama (training/tools/tiny.py: 4 layers x 256, the
SmolLM2 tokenizer's 49,152 tokens). Step 1 warms up (AdamW's state and the gradients exist
from then on, as in every later step); step 2's phases are measured, then its checkpoint.

What is measured, per rank and phase: the bytes of tensors alive at the phase's start (every
torch.Tensor the garbage collector tracks, each storage once: weights, shards, gradients, AdamW
state, frozen copies) plus the largest rise of the process's resident memory during the phase
(VmHWM, reset at the phase's start), with glibc mapping every allocation of 64 KiB or more on its
own (MALLOC_MMAP_THRESHOLD_), so that a freed tensor leaves the resident size at once. That is
the CPU counterpart of torch.cuda's max_memory_allocated, give or take the few MiB of Python
objects a phase makes. (torch.profiler's memory events were tried first: they miss frees, so
their running sum climbs hundreds of MiB over a phase that ends holding what it started with.)
On CPU a rank's host memory is its device's, so rank 0's checkpoint figure includes what the
formula puts in host memory (the gathered optimizer state and the weights' copy written to disk).

The formula is given the longest conversation measured (tokens) as its sequence length, and
the run's own settings otherwise; other ranks' figures leave out rank 0's own work (the
checkpoint's host part; evaluation's conversations: they wait inside the gathering). Prints one
line per phase and rank, measured and formula side by side; --out writes them as JSON. Run by
tests/training/rl/test_phase_memory.py, which asserts each is within 20%.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CONFIG = """
name = "phase-memory"
domain = "p4g"
regime = "cotrain"
base_model = "{model}"
finetune = "full"
dtype = "bfloat16"
mixed_precision = true
beta = 0.05
simulator_beta = 0.05
steps = 2
group_size = 4
batch_tasks = 2
rollouts_at_once = 2
lr = 1e-3
temperature = 1.0
max_new_tokens = 16
max_turns = 4
micro_batch = 2
eval_every = 2
eval_samples = 2
save_every = 0
threads = 1
[tasks]
max_train = 4
max_eval = 1
[distributed]
processes = 2
strategy = "fsdp"
[simulator]
name = "self"
kind = "plain"
temperature = 1.0
max_new_tokens = 16
[[heldout]]
name = "frozen"
kind = "plain"
model = "{other}"
temperature = 1.0
max_new_tokens = 16
"""
PHASES = ("rollout", "update", "checkpoint", "evaluation")


def held_bytes() -> int:
    """The bytes of every tensor storage the garbage collector reaches, each once."""
    gc.collect()
    seen, total = set(), 0
    for obj in gc.get_objects():
        if not isinstance(obj, torch.Tensor) or obj.is_meta:
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        if storage.data_ptr() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def resident_bytes(key: str = "VmRSS") -> int:
    """This process's resident memory (VmRSS), or its peak since the last reset (VmHWM)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) * 1024


class PhaseMeter:
    """Each phase's peak: the tensors held at its start, plus the largest rise of the process's
    resident memory during it (the peak resident size, VmHWM, reset at the phase's start by
    writing 5 to /proc/self/clear_refs). With MALLOC_MMAP_THRESHOLD_ = 64 KiB (set by main)
    glibc maps every tensor of 64 KiB or more on its own and unmaps it when freed, so the
    resident size rises and falls with them: what else a phase allocates (Python objects, the
    small tensors) is a few MiB beside them."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.starts: dict[str, int] = {}
        self.name, self.start, self.rss = None, 0, 0

    def begin(self, name: str) -> None:
        self.end()
        self.name, self.start = name, held_bytes()
        self.rss = resident_bytes()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS

    def end(self) -> None:
        if self.name is None:
            return
        self.peaks[self.name] = self.start + max(0, resident_bytes("VmHWM") - self.rss)
        self.starts[self.name] = self.start
        self.name = None

    def __call__(self, phase: str, *args) -> None:
        """train_step's `phase` (said again as conversations end: a phase begins once)."""
        name = {"rollouts": "rollout"}.get(phase, phase)
        if name != self.name:
            self.begin(name)


class Unmeasured:
    """Stands in for the run's PhaseMemory: its phases measure nothing."""

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def worker(config_path: str, out: str) -> None:
    """One rank: the run's set-up as training/trainer/loop.py's _train, step 1, then step 2's
    phases and checkpoint measured."""
    from training.config import load_config
    from training.measures.held_out import HeldOutPanel
    from training.regimes.choose import make_regime
    from training.regimes.regime import ModelCache
    from training.rl.distributed import Ranks
    from training.rl.policy import Policy
    from training.tools.dryrun import memory
    from training.trainer import checkpoint
    from training.trainer.loop import Run, _speaker, select_scenarios, train_step

    config = load_config(config_path)
    ranks = Ranks.start(config)
    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    domain = config.build_domain()
    train, held = (select_scenarios(domain, config.tasks, w) for w in ("train", "eval"))
    torch.manual_seed(config.seed)
    models = ModelCache(config)
    agent = Policy.for_run(config, lr=config.agent_lr, ranks=ranks)
    panel = HeldOutPanel(config, domain, held, models)
    regime = make_regime(config, run_dir, models, ranks)
    # the trainer's own PhaseMemory (training/trainer/memory.py) resets the resident peak at its
    # phases' starts, simulator_update's inside this meter's update: it stands aside here
    run = Run(
        config,
        run_dir,
        domain,
        train,
        agent,
        _speaker(config, agent),
        regime,
        panel,
        ranks,
        None,
        None,
        Unmeasured(),
    )
    train_step(run, 1, lambda *a: None)
    meter = PhaseMeter()
    _, rollouts = train_step(run, 2, meter)
    meter.begin("checkpoint")
    checkpoint.save(run_dir, 2, config, agent, regime, {}, ranks=ranks)
    meter.end()
    longest = max(len(t.ids) for r in rollouts for t in (r.agent, r.user))
    estimate = memory(config, sequence=longest)
    formula = dict(estimate["phases_checkpointing_off"])
    # rank 0's own work: the checkpoint's host part; the panel's one (member, task) unit, which
    # rank 0 plays (training/measures/held_out.py shares units across ranks) while rank 1 waits
    if not ranks.main:
        formula["checkpoint"] -= estimate["checkpoint_host"]
        formula["evaluation"] -= (
            estimate["evaluation_kv"] + estimate["evaluation_logits"] + estimate["evaluation_cast"]
        )
    figures = {
        "rank": ranks.rank,
        "sequence_length": longest,
        "phases": {
            p: {"measured": meter.peaks[p], "formula": formula[p], "held_at_start": meter.starts[p]}
            for p in PHASES
        },
        "formula_terms": {k: v for k, v in estimate.items() if isinstance(v, (int, float))},
    }
    Path(out).with_suffix(f".rank{ranks.rank}.json").write_text(json.dumps(figures, indent=2))
    ranks.barrier()
    ranks.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    parser.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    from training.tools.tiny import build_tiny_model

    base = os.environ.get("PARLEY_BASE_MODEL", str(REPO / "data/models/SmolLM2-135M-Instruct"))
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(
            Path(tmp) / "tiny", Path(base), layers=4, hidden=256, init_range=0.02
        )
        other = build_tiny_model(
            Path(tmp) / "other", Path(base), layers=4, hidden=256, init_range=0.02, seed=1
        )
        config = Path(tmp) / "run.toml"
        config.write_text(f'output_dir = "{tmp}/run"\n' + CONFIG.format(model=model, other=other))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        out = Path(tmp) / "figures"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--master_port",
                str(port),
                __file__,
                "--worker",
                str(config),
                str(out),
            ],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"},
        )
        ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in (0, 1)]
    print(f"{'phase':<12}{'rank':>5}{'measured MiB':>14}{'formula MiB':>13}{'ratio':>7}")
    for phase in PHASES:
        for figures in ranks:
            m, f = (figures["phases"][phase][k] for k in ("measured", "formula"))
            print(
                f"{phase:<12}{figures['rank']:>5}{m / 2**20:>14.1f}{f / 2**20:>13.1f}{m / f:>7.2f}"
            )
    if os.environ.get("PHASE_MEMORY_DEBUG"):
        print(json.dumps(ranks, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(ranks, indent=2))


if __name__ == "__main__":
    main()
