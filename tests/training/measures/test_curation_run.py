"""[curation] in a real (tiny) P4G training run: the gate's counts, the weights' ESS and the
simulator's MCI in every metrics row, measured in the run's behaviour space; a step whose
every rollout the gate drops trains nothing."""

import json

import pytest

from tests.training.measures.test_behaviour_run import corpus  # noqa: F401 (a fixture)
from training.config import parse_config
from training.trainer.loop import train

ROLLOUTS = 4  # one task, a group of 4


def settings(tiny_model, corpus, out, curation):  # noqa: F811
    return parse_config(
        {
            "name": "curated",
            "domain": "p4g",
            "base_model": str(tiny_model),
            "steps": 2,
            "group_size": ROLLOUTS,
            "batch_tasks": 1,
            "max_new_tokens": 6,
            "max_turns": 4,
            "micro_batch": 8,
            "threads": 1,
            "simulator": {"name": "tiny", "max_new_tokens": 6},
            "eval_at_end": False,
            "tasks": {"max_eval": 1},
            "output_dir": str(out),
            "behaviour": {
                "reference": "p4g_corpus",
                "corpus": str(corpus),
                "clusters": 3,
                "probe_tasks": 1,
                "bootstrap": 0,
                "dialogue_acts": False,
            },
            "curation": {"enabled": True} | curation,
        }
    )


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_curated_run_logs_the_gate_the_weights_and_their_ess(tiny_model, corpus, tmp_path):  # noqa: F811
    out = tmp_path / "curated"
    # the tiny model's six-token turns are all cut: the "cut" gate would leave nothing to weigh
    curation = {"gate": ["fallback", "empty", "parse"], "mode_balance": True}
    train(settings(tiny_model, corpus, out, curation), show_progress=False)
    for row in rows(out):
        kept, gated = row["curation/kept"], row["curation/gated"]
        assert kept + gated == ROLLOUTS and "curation/gated/cut" not in row
        assert gated == max(row[f"curation/gated/{g}"] for g in ("fallback", "empty", "parse"))
        assert 0 < row["curation/ess"] <= kept and 0 < row["curation/ess_share"] <= 1
        assert row["curation/weight_min"] <= 1 <= row["curation/weight_max"] <= 5
        assert 1 / 3 <= row["curation/mci/training"] <= 1  # K = 3 clusters
        assert 0 <= row["curation/density_mean"] <= 1 and 1 <= row["curation/modes"] <= 3
        assert row["trained_sequences"] <= kept
        # the profiles measure in the same space beside it
        assert "behaviour/clusters/probe/mci/training" in row


def test_a_step_whose_every_rollout_is_gated_trains_nothing(tiny_model, corpus, tmp_path):  # noqa: F811
    out = tmp_path / "gated"
    train(
        settings(tiny_model, corpus, out, {"gate": ["cut"], "diversity": False}),
        show_progress=False,
    )
    for row in rows(out):
        # every simulator turn of six tokens ran out of them (no stop sampled)
        assert row["curation/gated/cut"] == ROLLOUTS == row["curation/gated"]
        assert row["curation/kept"] == 0 and row["curation/ess"] == 0
        assert row["trained_sequences"] == 0 and row["optimizer_step"] == 0
        assert "curation/density_mean" not in row  # the gate alone weighs nothing


CURATED = """
name = "curated"
domain = "p4g"
base_model = "{model}"
steps = 2
group_size = 4
batch_tasks = 2              # one task's group per rank
lr = 1e-2
max_new_tokens = 6
max_turns = 4
micro_batch = 4
save_every = 1
threads = 1
heldout = []
eval_at_end = false
[simulator]
name = "tiny"
max_new_tokens = 6
[behaviour]
reference = "p4g_corpus"
corpus = "{corpus}"
clusters = 3
probe_tasks = 1
bootstrap = 0
dialogue_acts = false
[curation]
enabled = true
gate = ["empty"]
mode_balance = true
"""


def test_two_processes_curate_as_one_process_does(smooth_tiny_model, corpus, tmp_path):  # noqa: F811
    """Data-parallel: rank 0 weighs the whole step in its space and every rank trains its own
    rows with their weights, so 2 ranks take the 1-rank step (the same rows, the same
    adapter)."""
    from tests.support.training import adapter, assert_same, metrics, one_and_two

    path = tmp_path / "curated.toml"
    path.write_text(CURATED.format(model=smooth_tiny_model, corpus=corpus))
    one, two = one_and_two(path, tmp_path)
    single = metrics(one)
    assert any(r["curation/weight_min"] < r["curation/weight_max"] for r in single)  # not all 1
    for row, ref in zip(metrics(two), single, strict=True):
        curated = {k: v for k, v in ref.items() if k.startswith("curation/")}
        assert {k: row[k] for k in curated} == pytest.approx(curated)
        assert row["loss"] == pytest.approx(ref["loss"], abs=1e-6)
    assert_same(adapter(one, 2), adapter(two, 2))
