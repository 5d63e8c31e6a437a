"""A training run on the CooperBench Domain, end to end on a tiny model: the trainer's own loop
(rollouts with the co-trained partner in its sandbox, the benchmark's scoring, both GRPO
updates, the run's files). What the tiny model writes is noise, so this is the wiring only."""

import json

from tests.support.cooperbench import needs_bwrap
from training.config import parse_config
from training.trainer.loop import train


@needs_bwrap
def test_one_co_training_step_on_cooperbench_runs_through_the_trainer(tiny_model, tmp_path):
    config = parse_config(
        {
            "name": "cooperbench-wiring",
            "domain": "cooperbench",
            "regime": "cotrain",
            "base_model": str(tiny_model),
            "steps": 1,
            "batch_tasks": 1,
            "group_size": 2,
            "max_new_tokens": 8,
            "max_turns": 4,  # two steps each
            "eval_every": 0,
            "simulator": {"max_new_tokens": 8},
            "tasks": {"eval_split": "all", "train_ids": ["tinycalc_task/task1/f1_f2"]},
            "output_dir": str(tmp_path / "run"),
            "threads": 1,
        }
    )
    train(config, show_progress=False)
    (row,) = [json.loads(line) for line in (config.run_dir() / "metrics.jsonl").open()]
    assert row["step"] == 1 and "sim/learned" in row
    samples = [json.loads(line) for line in (config.run_dir() / "samples.jsonl").open()]
    assert {s["task"] for s in samples} == {"tinycalc_task/task1/f1_f2"}
    for sample in samples:  # two steps each, in turn; nothing submitted, so nothing passed
        steps = [m["role"] for m in sample["conversation"] if m["role"] != "tool"]
        assert steps == ["assistant", "user", "assistant", "user"]
        assert sample["end_reason"] == "max_turns" and sample["reward"] == 0.0
