"""The paper's results (training/tools/paper.py): one registry, one config each, every config ready for
one 8-GPU node offline; and `steps = 0`, the base evaluation those configs' Base rows use."""

from __future__ import annotations

import json

import pytest

from training.__main__ import main
from training.config import load_config, parse_config
from training.tools.paper import (
    CONFIGS,
    DOMAINS,
    RELEASE_COTRAIN_TASKS,
    RELEASE_HELD_OUT,
    RELEASE_TRAIN_TASKS,
    RESULTS,
    by_key,
    task_draws,
)
from training.trainer.loop import train


def test_every_result_has_its_config_and_every_config_its_result():
    keys = [r.key for r in RESULTS]
    assert len(set(keys)) == len(keys)
    assert {r.config for r in RESULTS} == set(CONFIGS.glob("*.toml"))
    assert {r.domain for r in RESULTS} == set(DOMAINS)
    for result in RESULTS:
        assert (
            result.launcher.split("@")[-1].isalnum() and len(result.launcher.split("@")[-1]) == 40
        )
        assert result.differences or result.domain == "retail", result.key
    # the results the issue names, for each chat domain the release covers
    for domain in ("p4g", "retail", "airline"):
        for name in (
            "base",
            "single-gpt5mini",
            "single-haiku",
            "single-gemini",
            "ensemble",
            "verbalized",
            "verbalized-prob",
            "selfplay",
            "population",
        ):
            assert f"{domain}-{name}" in by_key()
    assert {"retail-persona", "retail-cooperative", "airline-persona"} <= set(by_key())


def test_paper_lists_every_result_with_command_and_memory(capsys):
    code = main(["paper", "--json"])
    data = json.loads(capsys.readouterr().out)
    rows = {row["key"]: row for row in data["results"]}
    assert set(rows) == {r.key for r in RESULTS}
    for key, row in rows.items():
        assert row["command"] == (
            "accelerate launch --config_file training/accelerate/one_node_8gpu_fsdp.yaml"
            f" -m training run training/configs/paper/{key}.toml"
        )
        assert row["ready"], (key, row["failed_checks"])
        assert 0 < row["memory_gib"] <= 80, key
        assert row["memory"]["strategy"] == "fsdp" and row["memory"]["processes"] == 8
    assert code == 0
    main(["paper"])
    assert "retail-selfplay" in capsys.readouterr().out


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.key)
def test_every_paper_config_passes_the_offline_dry_run(result, capsys):
    code = main(["run", str(result.config), "--dry-run", "--offline", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["ok"], [c for c in out["checks"] if not c["ok"]]
    assert code == 0
    config = load_config(result.config)
    if config.domain == "cooperbench":  # the release's CooperBench launcher (train_qwen3_5_27b.sh)
        assert config.base_model.endswith("Qwen3.5-27B") and config.steps == 500
        assert (config.batch_tasks, config.group_size) == (8, 8)  # global batch 64
        assert config.distributed.processes == 8 and config.eval_every == 0
        assert config.simulator.endpoint and config.simulator.api_key_env  # a hosted partner
        assert config.gradient_checkpointing and config.finetune == "lora"
        assert out["memory"]["total_checkpointing_on_gib"] <= 80
        return
    assert config.finetune == "full" and config.distributed.strategy == "fsdp"
    assert config.distributed.processes == 8 and config.base_model.endswith(
        "Qwen3-4B-Instruct-2507"
    )
    assert (config.batch_tasks, config.group_size) == (16, 8)  # the release's 16 x 8 = 128
    assert not config.scale_std and config.weight_decay == 0.1
    assert config.eval_samples == 4
    if config.domain == "p4g":  # the release's task, data and evaluation draw (issue 38)
        assert config.domain_protocol == "release" and config.domain_data == "/data/p4g"
        assert (config.tasks.eval_split, config.tasks.eval_draw) == ("train", "training_cursor")
    else:
        assert config.tasks.eval_split == "test"
    if config.domain != "p4g":
        assert config.tasks.max_eval == 8 and config.domain_data == "/data/tau2"
    # the panel: the paper's six, less the models this run trains against
    assert len(config.heldout) >= 3 and all(s.api_key_env for s in config.heldout)


def base_evaluation(tiny_model, tmp_path, **extra):
    data = {
        "name": "base",
        "domain": "letters",
        "base_model": str(tiny_model),
        "steps": 0,
        "group_size": 2,
        "max_new_tokens": 4,
        "max_turns": 2,
        # never loaded: a base evaluation builds no regime, so no training simulator
        "simulator": {"model": str(tmp_path / "no-such-model")},
        "tasks": {"max_eval": 1},
        "eval_samples": 2,
        "output_dir": str(tmp_path / "run"),
        "threads": 1,
    }
    data.update(extra)
    return parse_config(data)


def test_steps_zero_evaluates_the_starting_policy_and_stops(
    tiny_model, other_tiny_model, tmp_path, letters
):
    heldout = [{"name": "other", "model": str(other_tiny_model), "max_new_tokens": 4}]
    config = base_evaluation(tiny_model, tmp_path, heldout=heldout)
    assert train(config, domain=letters, show_progress=False) == []  # no checkpoint
    rows = [
        json.loads(line) for line in (config.run_dir() / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 1 and rows[0]["step"] == 0 and rows[0]["optimizer_steps"] == 0
    assert "heldout/other/success" in rows[0]
    assert not (config.run_dir() / "checkpoints").exists()
    train(config, domain=letters, show_progress=False)  # again: the figures are replaced
    assert len((config.run_dir() / "metrics.jsonl").read_text().splitlines()) == 1


def test_steps_zero_needs_a_panel(tiny_model, tmp_path, letters):
    with pytest.raises(ValueError, match="steps = 0 evaluates the held-out panel"):
        train(base_evaluation(tiny_model, tmp_path), domain=letters, show_progress=False)


def test_paper_states_what_each_tau2_result_trained_on_in_the_release_and_here(capsys):
    """The release's tau2 runs played fixed tasks (training/vocabulary.py TASK_DRAWS); each tau2
    result says which, what its config plays, and whether released held-out numbers were
    measured on trained tasks. The ids are those of the official retail data."""
    from agents.domains import get_domain
    from tests.support.processes import official_tau2_dir

    retail = get_domain("retail", str(official_tau2_dir()))
    train, test = ([s.id for s in retail.scenarios(split)] for split in ("train", "test"))
    assert list(RELEASE_TRAIN_TASKS) == train[:16] and list(RELEASE_HELD_OUT) == test[:8]
    assert set(RELEASE_COTRAIN_TASKS) <= {s.id for s in retail.scenarios(None)}

    for result in RESULTS:
        draws = task_draws(result)
        if result.domain not in ("retail", "airline"):
            assert draws is None
            continue
        config = load_config(result.config)
        if config.steps == 0:
            continue
        measured_on_trained = "partly measured on tasks it trained on (3 of the 8)"
        assert (measured_on_trained in draws["release"]) == config.trains_simulator, result.key
        assert ("5, 9, 12" in draws["release"]) == config.trains_simulator
        # retail reproduces the release's draw; airline, which the release never ran, the intended
        expected = "release" if result.domain == "retail" else "split"
        assert config.task_draw == expected, result.key
        assert f'task_draw = "{expected}"' in draws["parley"]
    main(["paper"])
    out = capsys.readouterr().out
    assert "tasks:    release: the release played task ids 0-15 of all 114" in out
    assert 'parley:  the same (task_draw = "release")' in out
