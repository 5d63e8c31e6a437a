"""Data-parallel training: which rank this process is, its share of a step's tasks, the sums
and gathers the ranks need, and how a rank's failure is recorded.

    accelerate launch --num_processes 2 -m training run CONFIG.toml             # GPUs
    accelerate launch --multi_gpu --num_processes 2 -m training run CONFIG.toml # CPU (gloo)

`accelerate launch` (torchrun underneath) starts the processes and sets RANK / WORLD_SIZE;
`Ranks.start` joins them through accelerate's `Accelerator` (gloo on CPU, nccl on GPU). A plain
`python -m training run` is one rank, and every method here is then a no-op.

With `distributed.strategy = "fsdp"` (and more than one rank) each trained model is wrapped in
torch FSDP (FULL_SHARD, a unit per decoder layer, use_orig_params so a frozen base and its LoRA
share one): every
forward pass through the wrapper is then a collective, so the trainer keeps the ranks in
lockstep (see `Ranks.shard`, grpo.update and `gathered` in training/rl/policy.py).

A rank that raises writes its traceback to <run>/failures/rank-K.txt before it dies; the
launcher then stops the other ranks, and whoever started the launcher (the CLI user, the
TrainingRun's Celery task) reads those files to say which rank failed and why.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch

FAILURES = "failures"

T = TypeVar("T")


class PeerLost(RuntimeError):
    """A collective failed because another rank is gone: a consequence, not the cause."""


# What the backends say when the other end of a collective is gone (gloo, then NCCL); FSDP's own
# collectives, inside the model's passes and its state dicts, raise these as they are.
PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe"
    r"|communicator was aborted|Watchdog caught collective operation timeout"
)


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is another rank being gone."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, PeerLost) or (
            isinstance(seen, RuntimeError) and PEER_GONE.search(str(seen))
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _collective(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except RuntimeError as exc:  # gloo/nccl: "Connection closed by peer", timeouts
        raise PeerLost(f"another rank stopped ({exc})") from exc


class Ranks:
    """This process's place among the run's processes (rank 0 of 1 when not launched)."""

    def __init__(self, rank: int = 0, world: int = 1, accelerator: Any = None, fsdp: bool = False):
        self.rank, self.world, self.accelerator = rank, world, accelerator
        self.fsdp = fsdp and world > 1  # one process holds the whole model: nothing to shard

    @classmethod
    def start(cls, config: Any) -> Ranks:
        """Join the launched processes (none: one rank)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        if config.batch_tasks < world:
            raise ValueError(
                f"batch_tasks = {config.batch_tasks} gives some of the {world} processes no task:"
                " every rank rolls out at least one task's group"
            )
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=config.device == "cpu")
        fsdp = config.distributed.strategy == "fsdp"
        return cls(accelerator.process_index, accelerator.num_processes, accelerator, fsdp)

    def shard(
        self, model: torch.nn.Module, compute_dtype: torch.dtype | None = None
    ) -> torch.nn.Module | None:
        """Under FSDP, `model` wrapped in FSDP (its parameters sharded over the ranks from now
        on: call it through the wrapper, or inside `gathered`); else None. `compute_dtype`
        (mixed_precision: `model` is float32): the wrapper's passes gather and compute in it
        while the shards, their gradients (reduced in float32) and AdamW state stay float32.
        Buffers keep their own dtype: Llama/Qwen's rotary frequencies are computed in float32,
        as in one process. `gathered` weights (sampling, evaluation, saving) are float32."""
        if not self.fsdp:
            return None
        from torch.distributed.fsdp import (
            FullyShardedDataParallel,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        # a unit per decoder layer: a pass gathers one layer at a time, not the whole model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        names = set(getattr(base, "_no_split_modules", None) or ())
        layers = {type(m) for m in model.modules() if type(m).__name__ in names}
        device = next(model.parameters()).device
        return FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy(layers) if layers else None,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            use_orig_params=True,  # a frozen base and its trainable LoRA in one flat parameter
            device_id=device,  # on CPU too (gloo): FSDP otherwise looks for a GPU
            mixed_precision=MixedPrecision(
                param_dtype=compute_dtype, reduce_dtype=torch.float32, buffer_dtype=None
            )
            if compute_dtype is not None
            else None,
        )

    @property
    def main(self) -> bool:
        """Rank 0 alone writes metrics, samples, plots and checkpoints."""
        return self.rank == 0

    def share(self, items: list[T]) -> list[T]:
        """This rank's contiguous block of `items` (a step's tasks): the first len % world ranks
        take one more. Deterministic, so any rank knows every rank's share."""
        size, extra = divmod(len(items), self.world)
        start = self.rank * size + min(self.rank, extra)
        return items[start : start + size + (self.rank < extra)]

    def total(self, value: float) -> float:
        """The sum of `value` over the ranks."""
        if self.world == 1:
            return float(value)
        tensor = torch.tensor([float(value)], dtype=torch.float64)
        _collective(torch.distributed.all_reduce, tensor)
        return float(tensor)

    def most(self, value: int) -> int:
        """The largest `value` over the ranks (FSDP: how many passes every rank makes)."""
        if self.world == 1:
            return int(value)
        tensor = torch.tensor([int(value)], dtype=torch.int64)
        _collective(torch.distributed.all_reduce, tensor, torch.distributed.ReduceOp.MAX)
        return int(tensor)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Replace each gradient by its sum over the ranks (a rank with nothing to train adds 0).
        A sum, not DDP's mean: see grpo.update for why."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # one collective, not one per tensor
        _collective(torch.distributed.all_reduce, flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's `items`, concatenated in rank order (so a step's tasks in their order)."""
        if self.world == 1:
            return items
        parts: list[Any] = [None] * self.world
        _collective(torch.distributed.all_gather_object, parts, items)
        return [item for part in parts for item in part]

    def barrier(self) -> None:
        if self.world > 1:
            _collective(torch.distributed.barrier)

    def record_failure(self, run_dir: Path, exc: BaseException) -> None:
        """Write the exception being handled to <run>/failures/rank-K.txt (rank-K.stopped.txt
        when this rank only lost a peer)."""
        folder = Path(run_dir) / FAILURES
        folder.mkdir(parents=True, exist_ok=True)
        name = f"rank-{self.rank}.stopped.txt" if lost_peer(exc) else f"rank-{self.rank}.txt"
        (folder / name).write_text(traceback.format_exc())

    def clear_failures(self, run_dir: Path) -> None:
        """A (re)started run forgets the failures of an earlier attempt (rank 0, before any step)."""
        if self.main:
            for path in (Path(run_dir) / FAILURES).glob("rank-*"):
                path.unlink()
        self.barrier()

    def close(self) -> None:
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@contextmanager
def full_weights(sharded: torch.nn.Module | None, writeback: bool = False) -> Iterator[None]:
    """Under FSDP (`sharded` the wrapper from Ranks.shard), the wrapped model's full weights on
    every rank while it lasts: a collective every rank enters, after which passes through the
    unwrapped model make none (sampling to each rank's own lengths). Those passes skip FSDP's
    per-layer units, each of which would otherwise gather and free its layer again: a collective
    per layer. `writeback` keeps what was loaded into the weights. Without FSDP, nothing."""
    if sharded is None:
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = [u for u in FSDP.fsdp_modules(sharded) if u is not sharded]
    with FSDP.summon_full_params(sharded, writeback=writeback):
        for unit in units:
            unit.forward = unit.module.forward  # the layer itself, on its gathered weights
        try:
            yield
        finally:
            for unit in units:
                del unit.forward


def read_failures(run_dir: Path) -> str:
    """Which ranks failed and why (their tracebacks), then the ranks that only stopped because
    a peer was gone; "" when no rank wrote anything (killed outright: see the launcher's log)."""
    folder = Path(run_dir) / FAILURES
    rank = lambda path: int(path.name.split("-")[1].split(".")[0])  # noqa: E731
    failed = sorted(folder.glob("rank-*[0-9].txt"), key=rank)
    stopped = sorted(folder.glob("rank-*.stopped.txt"), key=rank)
    parts = [f"rank {rank(p)} failed:\n{p.read_text()}" for p in failed]
    if stopped:
        ranks = ", ".join(str(rank(p)) for p in stopped)
        parts.append(f"stopped because another rank was gone: rank {ranks}")
    return "\n".join(parts)


def launch_command(config: str | Path, processes: int, args: list[str]) -> list[str]:
    """The `accelerate launch --multi_gpu --num_processes N -m training run CONFIG ...` command
    line, with this interpreter and a free rendezvous port (runs side by side must not share one).
    `--multi_gpu` is accelerate's name for its torchrun launcher; it is what starts N processes
    on CPU too (`--cpu` would start one), and Ranks.start then joins them over gloo."""
    import socket
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(port), "--multi_gpu",
        "-m", "training", "run", str(config), *args,
    ]  # fmt: skip
