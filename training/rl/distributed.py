"""Data-parallel training: which rank this process is, its share of a step's tasks, the sums
and gathers the ranks need, and how a rank's failure is recorded.

    accelerate launch --num_processes 2 -m training run CONFIG.toml             # GPUs
    accelerate launch --multi_gpu --num_processes 2 -m training run CONFIG.toml # CPU (gloo)

`accelerate launch` (torchrun underneath) starts the processes and sets RANK / WORLD_SIZE;
`Ranks.start` starts the process group itself, with the run's backend and timeout
(distributed.backend: "cpu:gloo,cuda:nccl" on GPUs, gloo on CPU; distributed.timeout), and
makes its own sums and gathers on the device the group serves. A plain `python -m training run`
is one rank, and every method here is then a no-op.

With `distributed.strategy = "fsdp"` (and more than one rank) each trained model is wrapped in
torch FSDP (FULL_SHARD, a unit per decoder layer, use_orig_params so a frozen base and its LoRA
share one): every
forward pass through the wrapper is then a collective, so the trainer keeps the ranks in
lockstep (see `Ranks.shard`, grpo.update and `gathered` in training/rl/policy.py).

A rank that raises writes its traceback to <run>/failures/rank-K.txt before it dies (its own
failure, a collective's timeout naming the collective), or rank-K.stopped.txt when it only lost
a peer that was gone; the launcher then stops the other ranks, and whoever started the launcher (the CLI user, the
TrainingRun's Celery task) reads those files to say which rank failed and why.
"""

from __future__ import annotations

import atexit
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import torch

from agents.environment import setting

FAILURES = "failures"
# Set by the launcher (accelerate, torchrun) in each process it starts; neither: one rank.
WORLD_SIZE = setting(
    "WORLD_SIZE",
    "int",
    1,
    least=1,
    help="set by accelerate or torchrun: the processes of a distributed training run",
)
LOCAL_RANK = setting(
    "LOCAL_RANK",
    "int",
    0,
    least=0,
    help="set by accelerate or torchrun: this process's place on its machine (its GPU, "
    "unless the config names one)",
)

T = TypeVar("T")


class PeerLost(RuntimeError):
    """A collective failed because another rank is gone: a consequence, not the cause."""


class CollectiveTimeout(RuntimeError):
    """A collective waited past the process group's timeout (distributed.timeout) for a rank
    that did not reach it: that rank is still working, or hung."""


class CollectiveFailed(RuntimeError):
    """A collective failed on this rank for a reason of its own (a tensor on a device the
    group has no backend for, a shape the others do not share): the cause, not a consequence."""


# What the backends say when the other end of a collective is gone (gloo, then NCCL); FSDP's own
# collectives, inside the model's passes and its state dicts, raise these as they are.
PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe"
    r"|communicator was aborted"
)
# ... and when it waited past the group's timeout (gloo's pair, NCCL's watchdog, the store)
TIMED_OUT = re.compile(r"timed out|collective operation timeout", re.IGNORECASE)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is another rank being gone."""
    for seen in _chain(exc):
        if isinstance(seen, (CollectiveTimeout, CollectiveFailed)):
            return False  # classified where it happened: this rank's own failure
        if isinstance(seen, PeerLost) or (
            isinstance(seen, RuntimeError) and PEER_GONE.search(str(seen))
        ):
            return True
    return False


def group_backend(setting: str, device: torch.device) -> str:
    """The process group's backend for `distributed.backend`: "auto" gives NCCL for the GPUs'
    tensors with gloo beside it for anything a collective is asked to move from the CPU (what
    accelerate itself starts for FSDP's CPU-offloaded state dicts), gloo on CPU."""
    if setting != "auto":
        return setting
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def serves(backend: str, device_type: str) -> bool:
    """Whether a group started with `backend` ("nccl", "cpu:gloo,cuda:nccl") has a backend
    for tensors of `device_type`: NCCL has none for the CPU's."""
    if ":" in backend:
        return any(part.split(":")[0] == device_type for part in backend.split(","))
    capability = torch.distributed.Backend.backend_capability.get(backend.lower())
    return capability is None or device_type in capability  # a backend torch does not list


class Ranks:
    """This process's place among the run's processes (rank 0 of 1 when not launched).

    Every collective the trainer makes goes through `group` on tensors on `device`, the device
    its models compute on: NCCL serves cuda tensors alone, so a sum made on the CPU would be
    refused there. `group` is None (the default group) when that group serves `device`'s type,
    else a gloo group of the same ranks; FSDP is handed the same group."""

    def __init__(
        self,
        rank: int = 0,
        world: int = 1,
        *,
        fsdp: bool = False,
        device: torch.device | str = "cpu",
        group: Any = None,
        timeout: float = 0.0,
    ):
        self.rank, self.world, self.group = rank, world, group
        self.device, self.timeout = torch.device(device), timeout
        # one launched process shards too (FSDP of one rank: the GPU smoke's paper path); a
        # plain `python -m training run` holds the whole model
        self.fsdp = fsdp and torch.distributed.is_initialized()

    @classmethod
    def start(cls, config: Any) -> Ranks:
        """Join the launched processes (none: one rank). The process group is started here,
        with the run's backend and timeout (distributed.backend, distributed.timeout), unless
        the launcher already started one."""
        world = WORLD_SIZE.read()
        if world == 1 and not LOCAL_RANK.is_set():  # not under accelerate/torchrun
            return cls(device=config.device)
        if config.batch_tasks < world:
            raise ValueError(
                f"batch_tasks = {config.batch_tasks} gives some of the {world} processes no task:"
                " every rank rolls out at least one task's group"
            )
        from datetime import timedelta

        device = torch.device(config.device)
        if device.type == "cuda" and device.index is None:  # each process its own GPU
            device = torch.device("cuda", LOCAL_RANK.read())
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current device
        timeout = timedelta(seconds=config.distributed.timeout)
        dist = torch.distributed
        if not dist.is_initialized():
            backend = group_backend(config.distributed.backend, device)
            dist.init_process_group(backend=backend, timeout=timeout)
            # A group left to the interpreter's teardown after a collective timed out aborts the
            # process (gloo's destructor: "terminate called without an active exception",
            # SIGABRT), hiding the rank's own exit status and error; destroyed first, it exits
            # as the error left it. train() closes it too; this covers every other way out.
            atexit.register(cls.close)
        group = None
        if not serves(dist.get_backend(), device.type):
            group = dist.new_group(backend=group_backend("auto", device), timeout=timeout)
        fsdp = config.distributed.strategy == "fsdp"
        return cls(
            dist.get_rank(),
            dist.get_world_size(),
            fsdp=fsdp,
            device=device,
            group=group,
            timeout=config.distributed.timeout,
        )

    def _collective(self, name: str, call: Any, *args: Any, **kwargs: Any) -> None:
        """`call` on this rank's group, its failure said for what it is: this rank's own, a
        timeout in `name`, or another rank gone."""
        try:
            call(*args, group=self.group, **kwargs)
        except RuntimeError as exc:
            if PEER_GONE.search(str(exc)):
                message = f"rank {self.rank}: another rank stopped during {name} ({exc})"
                raise PeerLost(message) from exc
            if TIMED_OUT.search(str(exc)):
                raise CollectiveTimeout(
                    f"rank {self.rank}: {name} timed out: the other ranks did not reach it"
                    f" within distributed.timeout = {self.timeout:g} s ({exc})"
                ) from exc
            raise CollectiveFailed(f"rank {self.rank}: {name} failed on this rank: {exc}") from exc

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
            process_group=self.group,  # the group that serves the model's device
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
        tensor = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        self._collective("total (all_reduce)", torch.distributed.all_reduce, tensor)
        return float(tensor)

    def most(self, value: int) -> int:
        """The largest `value` over the ranks (FSDP: how many passes every rank makes)."""
        if self.world == 1:
            return int(value)
        tensor = torch.tensor([int(value)], dtype=torch.int64, device=self.device)
        max_ = torch.distributed.ReduceOp.MAX
        self._collective("most (all_reduce max)", torch.distributed.all_reduce, tensor, max_)
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
        self._collective("sum_gradients (all_reduce)", torch.distributed.all_reduce, flat)
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
        self._collective(
            "gather (all_gather_object)", torch.distributed.all_gather_object, parts, items
        )
        return [item for part in parts for item in part]

    def barrier(self) -> None:
        if self.world > 1:
            self._collective("barrier", torch.distributed.barrier)

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

    @staticmethod
    def close() -> None:
        if torch.distributed.is_initialized():
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
    on CPU too (`--cpu` would start one), and Ranks.start then joins them over gloo. accelerate
    refuses `--multi_gpu` for one process, so one process is started by torchrun itself: a
    launched rank of one (FSDP of one rank, the one-GPU smoke's paper path), not a plain run."""
    import socket
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = ["-m", "training", "run", str(config), *args]
    if processes == 1:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "1",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            *run,
        ]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        "--multi_gpu",
        *run,
    ]
