"""task_draw: the tasks a step plays. "split" draws from the train split each step (what the
release intended); "release" plays what the release's tau2 runs played, its data source having
fallen back to index-only samples (training/vocabulary.py TASK_DRAWS): the first 16 train tasks every
step, and under co-training the task ids 0-15 of the whole set, three of them held-out tasks."""

import json

import pytest

from agents.domains import get_domain
from agents.simulators.scripted import REMARKS
from tests.support.processes import official_tau2_dir
from tests.training.regimes.test_supplies import ENSEMBLE, MEMBERS, short_run
from training.config import parse_config
from training.config_keys import ConfigError
from training.config_schema import RunConfig
from training.trainer.loop import released_tasks, select_scenarios, step_tasks, train


def retail_config(folder, **extra) -> RunConfig:
    return parse_config(
        {
            "name": "draw",
            "domain": "retail",
            "domain_data": str(folder),
            "batch_tasks": 16,
            "tasks": {"max_eval": 8},
            **extra,
        }
    )


def test_the_release_draw_plays_what_the_releases_tau2_runs_played():
    folder = official_tau2_dir()
    domain = get_domain("retail", str(folder))
    held_out = [s.id for s in select_scenarios(domain, retail_config(folder).tasks, "eval")]
    assert held_out == ["5", "9", "12", "17", "18", "26", "27", "32"]  # the release's 8

    frozen = retail_config(folder, task_draw="release")  # single, persona, ensemble, verbalized
    played = released_tasks(domain, frozen, select_scenarios(domain, frozen.tasks, "train"))
    first16 = [
        "0",
        "1",
        "2",
        "3",
        "4",
        "6",
        "7",
        "8",
        "10",
        "11",
        "13",
        "14",
        "15",
        "16",
        "19",
        "20",
    ]
    assert [s.id for s in played] == first16  # the train split's first 16, in tasks.json order
    for step in (1, 2, 500):  # the same every step
        assert [s.id for s in step_tasks(frozen, played, step)] == first16

    cotrain = retail_config(folder, task_draw="release", regime="cotrain")  # and population
    played = released_tasks(domain, cotrain, select_scenarios(domain, cotrain.tasks, "train"))
    assert [s.id for s in played] == [str(i) for i in range(16)]  # ids over the whole set
    assert [s.id for s in played if s.id in held_out] == ["5", "9", "12"]

    split = retail_config(folder)  # the intended draw: the train split, drawn each step
    train = select_scenarios(domain, split.tasks, "train")
    one, two = (step_tasks(split, train, step) for step in (1, 2))
    assert len(set(s.id for s in one)) == 16 and {s.id for s in one + two} <= {s.id for s in train}
    assert [s.id for s in one] != [s.id for s in two]
    assert not {s.id for s in one + two} & set(held_out)


def test_the_release_draw_is_refused_where_the_release_read_its_files_in_order():
    with pytest.raises(ConfigError, match="task_draw .*tau2 data source"):
        parse_config({"name": "x", "domain": "p4g", "task_draw": "release"})


def test_a_release_draw_ensemble_run_gives_task_i_member_i_mod_k_every_step(
    tiny_model, tmp_path, letters
):
    """The run's tasks are the first batch_tasks train tasks each step, and a task's whole group
    meets member (position mod K), as the release's tau2 ensemble did (sample.index % 3)."""
    cfg = short_run(
        tiny_model,
        tmp_path,
        regime="ensemble",
        ensemble=ENSEMBLE,
        task_draw="release",
        batch_tasks=4,
        group_size=2,
        heldout=[],
    )
    train(cfg, domain=letters, show_progress=False)
    samples = [json.loads(x) for x in (cfg.run_dir() / "samples.jsonl").read_text().splitlines()]
    by_remark = {REMARKS[s]: n for n, s in MEMBERS.items()}
    for step in (1, 2):
        mine = [s for s in samples if s["step"] == step]
        assert [s["task"] for s in mine] == ["train-0", "train-1", "train-2", "train-3"]
        assert [by_remark[s["conversation"][0]["content"]] for s in mine] == ["a", "b", "c", "a"]
    rows = [json.loads(x) for x in (cfg.run_dir() / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["ensemble/a/share"] == 0.5 and rows[0]["ensemble/b/share"] == 0.25
