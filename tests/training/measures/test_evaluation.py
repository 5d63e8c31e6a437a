"""The held-out evaluation split across ranks: each of 2 real processes (a gloo group, through
Ranks.start) plays its share of the panel's (member, task) pairs and every rank ends with the
figures one process gives for the same seed, so no rank waits out the whole panel in a
collective."""

import json

import pytest

from agents.domains import get_domain
from tests.support.collectives import run_ranks
from training.config import parse_config
from training.measures.held_out import HeldOutPanel
from training.regimes.regime import ModelCache
from training.rl.policy import LocalModel
from training.trainer.loop import select_scenarios

PANEL = [{"name": t, "kind": "scripted", "script": t} for t in ("anchored", "reactant", "steady")]


def test_two_ranks_share_the_panel_and_give_one_rank_figures(tiny_model, tmp_path):
    settings = {
        "name": "evaluate",
        "domain": "p4g-decision",
        "base_model": str(tiny_model),
        "steps": 1,
        "group_size": 2,
        "batch_tasks": 2,
        "temperature": 1.0,
        "max_turns": 2,
        "micro_batch": 4,
        "eval_samples": 4,
        "heldout": PANEL,
        "threads": 1,
        "tasks": {"max_train": 2, "max_eval": 2},
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "config.json").write_text(json.dumps(settings))
    config = parse_config(settings)
    domain = get_domain("p4g-decision")
    tasks = select_scenarios(domain, config.tasks, "eval")
    assert len(tasks) == 2
    one = HeldOutPanel(config, domain, tasks, ModelCache(config)).evaluate(
        LocalModel.load(tiny_model), 1
    )

    ranks = run_ranks("evaluate", tmp_path)
    # 3 members x 2 tasks x 4 samples: each rank scored its half of the (member, task) pairs
    assert [r["scored"] for r in ranks] == [12, 12]
    for rank in ranks:
        row = rank["row"]
        assert row.keys() == one.keys()
        for key in one:
            if key == "heldout/entropy":  # summed over the ranks' shares: float order differs
                assert row[key] == pytest.approx(one[key], rel=1e-5)
            else:
                assert row[key] == one[key], key
