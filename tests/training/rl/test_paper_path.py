"""The paper's path at tiny scale, under the rules NCCL sets: 2 launched processes, FSDP, full
fine-tuning of both roles in mixed precision (a co-trained simulator: Self-Play), a held-out
evaluation, a checkpoint, and a resume at another process count (one launched process: FSDP of
one rank, as on the one-GPU smoke).

The process group is started with backend "cuda:gloo": gloo bound to the cuda device type
alone, so, as under NCCL, a collective on a CPU tensor through it is refused ("No backend type
associated with device type cpu"), and every collective the trainer makes or asks FSDP for must
go through the group it keeps for the run's own device. On main before issue 37 the first
update's `ranks.total` went to the default group and both ranks stopped there.

Each rank's peak memory per phase is written to <run>/memory/rank-K.json
(training/trainer/memory.py), for the dry run's estimate to be set beside."""

import json

from tests.support.training import launch, metrics
from training.rl.distributed import read_failures
from training.trainer import checkpoint
from training.trainer.memory import read_memory

PAPER_PATH = """
name = "paper-path"
domain = "p4g-decision"
base_model = "{model}"
regime = "cotrain"
finetune = "full"
dtype = "bfloat16"
mixed_precision = true
steps = 2
group_size = 2
batch_tasks = 3              # uneven: rank 1 pads with zero-weight passes under FSDP
lr = 1e-3
simulator_lr = 1e-3
beta = 0.05
temperature = 1.0
max_new_tokens = 8
max_turns = 2
micro_batch = 2
save_every = 1
eval_every = 1
eval_samples = 2
threads = 1
heldout = [{{name = "steady", kind = "scripted", script = "steady"}},
           {{name = "reactant", kind = "scripted", script = "reactant"}}]
[tasks]
max_train = 4
max_eval = 2
[simulator]
name = "persuadee"
kind = "plain"
temperature = 1.0
max_new_tokens = 8
[distributed]
strategy = "fsdp"
backend = "cuda:gloo"   # NCCL's rule on this CPU: the default group refuses CPU tensors
timeout = 120
"""

PHASES = {"load", "rollouts", "update", "simulator_update", "evaluation", "checkpoint"}


def test_the_paper_path_runs_under_nccl_rules_and_resumes_at_another_count(
    smooth_tiny_model, tmp_path
):
    path = tmp_path / "paper.toml"
    path.write_text(PAPER_PATH.format(model=smooth_tiny_model))
    out = tmp_path / "run"
    done = launch(path, out, timeout=150, args=["--steps", "1"])
    assert done.returncode == 0, read_failures(out) or done.stderr[-3000:]
    resumed = launch(path, out, processes=1, timeout=150)  # step 2 from step 1's checkpoint
    assert resumed.returncode == 0, read_failures(out) or resumed.stderr[-3000:]

    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["optimizer_step"] == 1.0 and row["sim/learned"] == 1.0
        assert {"heldout/steady/success", "heldout/reactant/reward", "heldout/entropy"} <= set(row)
    saved = [p.name for p in checkpoint.list_checkpoints(out)]
    assert saved == ["step-000001", "step-000002"]
    for role in ("", "simulator"):  # whole model folders, both roles
        folder = checkpoint.checkpoint_dir(out, 2) / role
        assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))

    # the 2-process run's ranks, then the resumed run's one rank (rank 0's file added to)
    memory = read_memory(out)
    assert [m["rank"] for m in memory] == [0, 1]
    for record in memory:
        assert record["measure"] == "rss" and record["start"] > 0
        assert set(record["phases"]) == PHASES, record
        assert all(p["peak"] > record["start"] / 2 for p in record["phases"].values())
    assert memory[0]["phases"]["update"]["times"] == 2  # step 1 on 2 ranks, step 2 on one
    assert memory[1]["phases"]["update"]["times"] == 1
    print(json.dumps(memory, indent=1))  # the figures, for a reader of the CI log
