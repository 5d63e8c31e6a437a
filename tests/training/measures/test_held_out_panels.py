"""The held-out panel as the release built it (issue 38 point 5) and the release's P4G
evaluation draw: a Persona-Guided or Verbalized Sampling run's members carry the run's
guidelines or VS setting, the plain panel is read out beside them under heldout_plain/; and
eval_draw = "training_cursor" gives each member the release's next 16 training tasks."""

from __future__ import annotations

import pytest

from agents.domains.base import Scenario
from tests.support.training import LetterDomain
from training.config import parse_config
from training.config_keys import ConfigError
from training.measures.held_out import HeldOutPanel, cursor_tasks
from training.regimes.regime import ModelCache
from training.rl.policy import LocalModel

GUIDE = "Vary your personality; sometimes refuse."


def config(tiny_model, other_tiny_model, tmp_path, regime, **extra):
    simulator = {"max_new_tokens": 6}
    if regime == "persona":
        simulator["guidelines"] = GUIDE
    if regime == "verbalized":
        simulator.update(kind="verbalized", k=3, draw="uniform")
    return parse_config(
        {
            "name": f"panel-{regime}",
            "domain": "letters",
            "regime": regime,
            "base_model": str(tiny_model),
            "max_new_tokens": 6,
            "max_turns": 2,
            "simulator": simulator,
            "heldout": [
                {"name": "other", "model": str(other_tiny_model), "max_new_tokens": 6},
                {"name": "anchored", "kind": "scripted", "script": "anchored"},
            ],
            "output_dir": str(tmp_path / regime),
            "threads": 1,
            **extra,
        }
    )


def test_persona_and_vs_panels_carry_the_runs_setting_and_keep_the_plain_read_out(
    tiny_model, other_tiny_model, tmp_path
):
    persona = config(tiny_model, other_tiny_model, tmp_path, "persona").panel_readouts()
    assert set(persona) == {"heldout", "heldout_plain"}
    like, plain = persona["heldout"], persona["heldout_plain"]
    assert like[0].guidelines == GUIDE and plain[0].guidelines == ""
    assert like[1] == plain[1]  # a scripted member has no prompt to prefix
    vs = config(tiny_model, other_tiny_model, tmp_path, "verbalized").panel_readouts()
    assert (vs["heldout"][0].kind, vs["heldout"][0].k, vs["heldout"][0].draw) == (
        "verbalized",
        3,
        "uniform",
    )
    assert vs["heldout_plain"][0].kind == "plain" and vs["heldout"][1].kind == "scripted"
    # other regimes, and a run that asks for the plain panel, have one read-out: the tables
    assert set(config(tiny_model, other_tiny_model, tmp_path, "single").panel_readouts()) == {
        "heldout"
    }
    asked = config(tiny_model, other_tiny_model, tmp_path, "persona", heldout_users="plain")
    assert asked.panel_readouts() == {"heldout": asked.heldout}


def test_both_read_outs_are_evaluated_under_their_own_names(tiny_model, other_tiny_model, tmp_path):
    cfg = config(tiny_model, other_tiny_model, tmp_path, "persona")
    domain = LetterDomain()
    panel = HeldOutPanel(cfg, domain, domain.scenarios("test")[:1], ModelCache(cfg))
    assert panel.readouts["heldout"]["other"].spec.guidelines == GUIDE
    assert panel.readouts["heldout_plain"]["other"].spec.guidelines == ""
    row = panel.evaluate(LocalModel.load(tiny_model), 1)
    for prefix in ("heldout", "heldout_plain"):
        for name in ("other", "anchored"):
            assert 0 <= row[f"{prefix}/{name}/reward"] <= 1
        assert row[f"{prefix}/worst_reward"] == min(
            row[f"{prefix}/other/reward"], row[f"{prefix}/anchored/reward"]
        )
    assert "heldout/entropy" in row and "heldout_plain/entropy" not in row


def test_the_release_p4g_draw_moves_one_cursor_over_the_training_tasks(
    tiny_model, other_tiny_model, tmp_path
):
    tasks = [Scenario(f"d{i:03d}", "letters", {"split": "train"}) for i in range(700)]
    cfg = config(
        tiny_model,
        other_tiny_model,
        tmp_path,
        "single",
        steps=100,
        eval_every=16,
        batch_tasks=16,
        group_size=8,
        eval_samples=4,
        tasks={"eval_split": "train", "eval_draw": "training_cursor"},
    )
    # the first evaluation follows 16 steps of 16 tasks: member 0 takes tasks 256..271, member
    # 1 the next 16; each task 8 x 4 times (a group of n_samples_per_prompt, 4 samples each)
    first = cursor_tasks(tasks, cfg, 16, 0, 6)
    assert len(first) == 16 and {times for _, times in first} == {8 * 4}
    assert first[0][0].id == "d256" and first[-1][0].id == "d271"
    assert cursor_tasks(tasks, cfg, 16, 1, 6)[0][0].id == "d272"
    # the second: 32 steps and the first evaluation's 6 x 16 tasks later, cycling at the end
    assert cursor_tasks(tasks, cfg, 32, 0, 6)[0][0].id == f"d{32 * 16 + 6 * 16:03d}"
    assert cursor_tasks(tasks, cfg, 48, 5, 6)[0][0].id == f"d{(48 * 16 + 12 * 16 + 80) % 700:03d}"
    assert cursor_tasks(tasks, cfg, 0, 0, 6)[0][0].id == "d000"  # a base evaluation
    with pytest.raises(ConfigError, match="eval_split = train_split"):
        config(
            tiny_model, other_tiny_model, tmp_path, "single", tasks={"eval_draw": "training_cursor"}
        )


def test_the_online_dry_run_asks_the_panel_as_the_run_builds_it():
    """The release's tau2 VS run: its panel members are sent Verbalized requests (k items), the
    P4G VS run's stay plain (heldout_users = "plain": the release's P4G panel)."""
    from pathlib import Path

    from training.config import load_config
    from training.tools.dryrun import endpoint_simulators

    paper = Path(__file__).resolve().parents[3] / "training" / "configs" / "paper"
    tau2 = endpoint_simulators(load_config(paper / "retail-verbalized.toml"))
    panel = [spec for role, spec in tau2 if role.startswith("held-out")]
    assert panel and all(s.kind == "verbalized" for s in panel)
    p4g = endpoint_simulators(load_config(paper / "p4g-verbalized.toml"))
    assert all(s.kind == "plain" for role, s in p4g if role.startswith("held-out"))
