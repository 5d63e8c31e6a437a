"""The ranks of tests/training/rl/test_collectives.py: each joins a real 2-process group through
Ranks.start and makes the trainer's collectives, writing what happened to OUT/rank-K.json.

The group is started with backend "cuda:gloo": gloo bound to the cuda device type alone, so, as
under NCCL, a collective on a CPU tensor through it is refused ("No backend type associated with
device type cpu"); the trainer must go through the group that serves its own device.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

from training.config_schema import DistributedSpec
from training.rl.distributed import Ranks


def evaluate(ranks: Ranks, out: Path) -> dict:
    """The held-out panel of OUT/config.json at step 1 (tests/training/measures/test_evaluation.py),
    with the conversations this rank scored counted."""
    from agents.domains import get_domain
    from training.config import parse_config
    from training.measures.held_out import HeldOutPanel
    from training.regimes.regime import ModelCache
    from training.rl.policy import LocalModel
    from training.trainer.loop import select_scenarios

    config = parse_config(json.loads((out / "config.json").read_text()))
    domain = get_domain(config.domain)
    scored, score = [0], domain.score

    def counted(*args, **kwargs):
        scored[0] += 1
        return score(*args, **kwargs)

    domain.score = counted
    tasks = select_scenarios(domain, config.tasks, "eval")
    panel = HeldOutPanel(config, domain, tasks, ModelCache(config))
    torch.set_num_threads(1)
    row = panel.evaluate(LocalModel.load(config.base_model_path()), 1, ranks)
    return {"row": row, "scored": scored[0]}


def rank_main(rank: int, scenario: str, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    timeout = 3 if scenario == "timeout" else 60
    spec = DistributedSpec(backend="cuda:gloo", timeout=timeout)
    ranks = Ranks.start(SimpleNamespace(batch_tasks=2, device="cpu", distributed=spec))
    result: dict = {"rank": ranks.rank}
    try:
        if scenario == "sums":
            weight = torch.nn.Parameter(torch.zeros(3))
            weight.grad = torch.full((3,), float(rank + 1))
            ranks.sum_gradients([weight])
            result |= {
                "total": ranks.total(rank + 1),
                "most": ranks.most(rank * 5),
                "gather": ranks.gather([rank, rank]),
                "gradient": weight.grad.tolist(),
            }
            ranks.barrier()
            ranks.group = None  # then the default group: a CPU tensor NCCL would refuse
            ranks.total(1.0)
        elif scenario == "timeout":
            if rank == 1:
                time.sleep(timeout + 3)  # still working when rank 0 gives up on it
            else:
                ranks.total(1.0)
        elif scenario == "evaluate":
            result |= evaluate(ranks, Path(out))
    except Exception as exc:
        try:
            raise
        except Exception:
            ranks.record_failure(Path(out), exc)
        result |= {"error": type(exc).__name__, "message": str(exc)}
    Path(out, f"rank-{rank}.json").write_text(json.dumps(result))
    if scenario != "timeout":
        ranks.close()


def run_ranks(scenario: str, out: Path) -> list[dict]:
    """`scenario` on 2 spawned ranks; what each wrote to OUT/rank-K.json."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(rank_main, args=(scenario, port, str(out)), nprocs=2, start_method="spawn")
    return [json.loads((Path(out) / f"rank-{r}.json").read_text()) for r in (0, 1)]
