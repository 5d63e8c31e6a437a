"""`python -m tests.support.dying_rank run CONFIG ...` is `python -m training run CONFIG ...` with
one rank made to die at the end of one step: after its update, as rank 0 is about to write the
checkpoint (a process dying mid-run), so the clean failure, the checkpoint barrier and the resume
are checked end to end. The fault comes from here, outside the product: the real entry point
runs with its `train_step` wrapped. DIE_AT ("RANK:STEP") in the environment says which.
"""

from __future__ import annotations

import os
import runpy

DIE_AT = "PARLEY_TEST_RANK_DIES_AT"


class RankDied(RuntimeError):
    pass


def dying(train_step):
    def step(run, number, phase):
        result = train_step(run, number, phase)
        wanted = os.environ.get(DIE_AT, "")
        if wanted == f"{run.ranks.rank}:{number}":
            raise RankDied(f"{DIE_AT}={wanted}: rank {run.ranks.rank} dies at step {number}")
        return result

    return step


def with_dying_rank(command: list[str]) -> list[str]:
    """A launch command (training.rl.distributed.launch_command) that runs this module on
    every rank instead of `training`."""
    at = next(i for i in range(len(command) - 1) if command[i : i + 2] == ["-m", "training"])
    return [*command[: at + 1], "tests.support.dying_rank", *command[at + 2 :]]


if __name__ == "__main__":
    from training.trainer import loop

    loop.train_step = dying(loop.train_step)
    runpy.run_module("training", run_name="__main__", alter_sys=True)
