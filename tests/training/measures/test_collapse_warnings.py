"""Collapse warnings in a real (tiny) training run: a simulator that always says the same thing
crosses the [collapse] thresholds, which the CLI prints once and the TrainingRun page shows
(stored by the Celery task's progress callback); a diverse simulator does not."""

import json

import pytest
from django.urls import reverse

from training.__main__ import main
from training.config import parse_config
from training.models import TrainingRun
from training.tasks import run_training
from training.trainer.loop import train

# the scripted "steady" persuadee says "I see. Go on." to anything that is not a choice turn
SAME_WORDS = {"name": "steady", "kind": "scripted", "script": "steady"}


def settings(tiny_model, out, simulator, **collapse):
    return {
        "base_model": str(tiny_model),
        "steps": 2,
        "group_size": 4,
        "lr": 1e-2,
        "max_new_tokens": 6,
        "max_turns": 2,  # the user speaks, the agent answers once
        "micro_batch": 8,
        "simulator": simulator,
        "heldout": [],
        "tasks": {"max_eval": 1},
        "output_dir": str(out),
        "threads": 1,
        "collapse": collapse,
    }


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_simulator_saying_the_same_thing_warns_once_on_the_command_line(
    tiny_model, tmp_path, capsys
):
    out = tmp_path / "out"
    config = {
        "name": "same",
        "domain": "letters",
        **settings(tiny_model, out, SAME_WORDS, min_agent_entropy=1000.0),
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(config))
    assert main(["run", str(path)]) == 0
    for row in rows(out):
        # "i see go on" x 4 conversations: 3 distinct bigrams of 12, one opening
        assert row["sim/distinct_1"] == 0.25 and row["sim/distinct_2"] == 0.25
        assert row["sim/top_opening_share"] == 1.0
        assert 0 < row["agent/distinct_1"] <= 1 and row["entropy"] > 0
        assert "sim/embedding_dispersion" not in row  # no embedding model configured
    err = capsys.readouterr().err
    expected = [
        "collapse warning: step 1: simulator reply diversity (distinct-2) 0.25 < "
        "collapse.min_sim_distinct_2 = 0.3",
        "collapse warning: step 1: share of the most frequent opening user reply 1 > "
        "collapse.max_sim_top_opening_share = 0.5",
        "collapse warning: step 1: agent token entropy (nats/token)",
    ]
    for line in expected:
        assert err.count(line) == 1, err  # steps 1 and 2 both cross it: printed once
    assert err.count("collapse warning:") == 3
    assert (out / "diversity.png").stat().st_size > 1000


def test_a_diverse_simulator_gives_no_warning(tiny_model, tmp_path, letters, capsys):
    out = tmp_path / "out"
    diverse = {"name": "hot", "temperature": 1.5, "max_new_tokens": 8}
    # the tiny Llama stands in for a local embedding model (mean-pooled hidden states)
    config = parse_config(
        {
            "name": "diverse",
            "domain": "letters",
            **settings(tiny_model, out, diverse, embedding_model=str(tiny_model)),
        }
    )
    progress = []
    train(config, progress.append, domain=letters, show_progress=False)
    assert [p["warnings"] for p in progress] == [[], []]
    assert "collapse warning" not in capsys.readouterr().err
    for row in rows(out):
        assert row["sim/distinct_2"] > 0.3 and row["sim/top_opening_share"] <= 0.5
        assert row["entropy"] > config.collapse.min_agent_entropy
        assert 0 < row["sim/embedding_dispersion"] <= 2


@pytest.mark.django_db
def test_the_run_page_shows_the_warnings_the_task_stored(tiny_model, tmp_path, admin_client):
    run = TrainingRun.objects.create(
        name="same-words",
        domain="letters",
        regime="single",
        settings=settings(tiny_model, tmp_path / "out", SAME_WORDS, min_agent_entropy=0.0),
    )
    assert run_training.apply((run.pk,)).get() == TrainingRun.Status.DONE
    run.refresh_from_db()
    assert [(w["step"], w["key"]) for w in run.progress["warnings"]] == [
        (1, "sim/distinct_2"),
        (1, "sim/top_opening_share"),
    ]
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert 'id="collapse-warnings"' in page
    assert (
        "step 1: simulator reply diversity (distinct-2) 0.25 &lt; collapse.min_sim_distinct_2 = 0.3"
        in page
    )
    assert reverse("admin:training_trainingrun_plot", args=[run.pk, "diversity.png"]) in page
    # the list of runs flags it too, by the measures that crossed
    listing = admin_client.get(reverse("admin:training_trainingrun_changelist")).content.decode()
    assert '<strong class="collapse-flag">sim/distinct_2, sim/top_opening_share</strong>' in listing


@pytest.mark.django_db
def test_a_new_warning_is_stored_at_once_between_throttled_writes():
    from training.tasks import progress_writer

    run = TrainingRun.objects.create(name="throttled", domain="letters")
    write = progress_writer(run, every=3600)  # otherwise one write an hour
    warning = {"step": 2, "key": "sim/distinct_2", "message": "step 2: ..."}
    write({"step": 1, "total_steps": 9, "warnings": []})
    write({"step": 2, "total_steps": 9, "warnings": [warning]})
    run.refresh_from_db()
    assert run.progress["step"] == 2 and run.progress["warnings"] == [warning]
    write({"step": 3, "total_steps": 9, "warnings": [warning]})  # nothing new: throttled
    run.refresh_from_db()
    assert run.progress["step"] == 2
