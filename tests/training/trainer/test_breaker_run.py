"""The breaker in a real (tiny) co-training run on the command line: a scripted SCD sequence
trips yellow then red, the run stops after a resumable checkpoint with the reason and exit
status 3, and running the same command again resumes from that checkpoint, re-diversifies the
co-trained simulator (back to its base) before the next step, and takes the way back down to
green. Only the measure is scripted (its real value is the tiny model's noise); the loop, the
writer, the checkpoint, the resume and the regime are the real ones."""

import json

import pytest
import torch

from training.__main__ import main
from training.measures.breaker import STOPPED_EXIT, last_stop, read_events
from training.regimes.regime import CoTrain
from training.trainer import loop

SCD = "behaviour/decision/probe/scd"
# warmup 0.3, 0.4: yellow > Q(0.9) = 0.39, red > max + 1 x range = 0.5
SCRIPT = {1: 0.3, 2: 0.4, 3: 0.45, 4: 0.7, 5: 0.2, 6: 0.2}

CONFIG = """
name = "breaker-run"
domain = "letters"
regime = "cotrain"
base_model = "{model}"
steps = 6
save_every = 0
group_size = 2
batch_tasks = 1
max_new_tokens = 4
max_turns = 2
threads = 1
output_dir = "{out}"
heldout = []
[tasks]
max_eval = 1
[simulator]
max_new_tokens = 4
[behaviour]
decisions_only = true
[breaker]
enabled = true
measures = ["scd"]
warmup = 2
yellow_step = 0.25
recover_steps = 1
"""


def rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def scripted(monkeypatch):
    """Each step's row gets the scripted SCD, as [behaviour] would write it."""
    real = loop.train_step

    def step(run, n, phase):
        row, rollouts = real(run, n, phase)
        return row | {SCD: SCRIPT[n]}, rollouts

    monkeypatch.setattr(loop, "train_step", step)


@pytest.fixture
def rediversified(monkeypatch):
    """CoTrain.rediversify as it is, noting when it ran and whether the simulator's LoRA was
    back at its base after (every B matrix zero)."""
    calls = []
    real = CoTrain.rediversify

    def spy(self):
        lora_b = [p for n, p in self.policy.model.named_parameters() if "lora_B" in n]
        trained = any(torch.any(p != 0) for p in lora_b)  # as the checkpoint held it
        what = real(self)
        logged = rows(self.config.run_dir())
        calls.append(
            {
                "rows_before": len(logged),
                "share": self.synthesis_share,
                "trained": trained,
                "at_base": bool(lora_b) and all(torch.all(p == 0) for p in lora_b),
            }
        )
        return what

    monkeypatch.setattr(CoTrain, "rediversify", spy)
    return calls


def test_red_stops_with_a_checkpoint_and_the_resumed_run_rediversifies(
    tiny_model, tmp_path, capsys, scripted, rediversified
):
    out = tmp_path / "out"
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(model=tiny_model, out=out))

    assert main(["run", str(path)]) == STOPPED_EXIT == 3
    said = capsys.readouterr().err
    assert "stopped by the breaker: the breaker went red at step 4" in said
    assert f"{SCD} = 0.7" in said and "checkpoint: " + str(out / "checkpoints/step-000004") in said
    logged = rows(out)
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert [r["breaker/level"] for r in logged] == [0, 0, 1, 2]
    assert [r["breaker/synthesis_share"] for r in logged] == [0, 0, 0.25, 0.25]
    # save_every = 0 saves only at the end: the step-4 checkpoint is the breaker's, complete
    # and resumable, with the breaker's state in it
    folder = out / "checkpoints" / "step-000004"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000004"]
    state = json.loads((folder / "breaker.json").read_text())
    assert state["level"] == "red" and state["stopped"]["step"] == 4
    assert (folder / "simulator" / "adapter_model.safetensors").is_file()
    stop = last_stop(out)
    assert stop["measures"] == {
        SCD: {"value": 0.7, "yellow": pytest.approx(0.39), "red": pytest.approx(0.5)}
    }
    assert not rediversified  # not while stopping: when the run goes on

    assert main(["run", str(path)]) == 0  # the same command resumes it
    said = capsys.readouterr().err
    assert "resumed after the red stop at step 4; re-diversified before step 5" in said
    # re-diversified once, before step 5 was played, on the simulator as the checkpoint held it
    assert rediversified == [{"rows_before": 4, "share": 0.25, "trained": True, "at_base": True}]
    logged = rows(out)
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
    # the way back: one calm step (recover_steps = 1) a level, the share back to the start
    assert [r["breaker/level"] for r in logged[4:]] == [1, 0]
    assert [r["breaker/synthesis_share"] for r in logged[4:]] == [0.25, 0]
    events = read_events(out)
    assert [(e["event"], e.get("from"), e.get("to")) for e in events] == [
        ("fit", None, None),
        ("transition", "green", "yellow"),
        ("transition", "yellow", "red"),
        ("resume", None, None),
        ("transition", "red", "yellow"),
        ("transition", "yellow", "green"),
    ]
    assert last_stop(out) is None
    assert (
        json.loads((out / "checkpoints/step-000006/breaker.json").read_text())["level"] == "green"
    )


def settings(tiny_model, out) -> dict:
    """CONFIG as the admin's settings JSON (the run's name, domain and regime are its fields)."""
    import tomllib

    data = tomllib.loads(CONFIG.format(model=tiny_model, out=out))
    return {k: v for k, v in data.items() if k not in ("name", "domain", "regime")}


@pytest.mark.django_db
def test_the_run_page_and_the_admin_say_why_it_stopped_and_resume_it(
    tiny_model, tmp_path, admin_client, scripted, rediversified
):
    from django.urls import reverse

    from training.models import TrainingRun
    from training.tasks import run_training

    run = TrainingRun.objects.create(
        name="breaker-page",
        domain="letters",
        regime="cotrain",
        settings=settings(tiny_model, tmp_path / "out"),
    )
    assert run_training.apply((run.pk,)).get() == TrainingRun.Status.STOPPED
    run.refresh_from_db()
    assert run.stop_reason.startswith("the breaker went red at step 4") and not run.error
    assert f"{SCD} = 0.7" in run.stop_reason
    # its checkpoint is registered like any other (servable, attachable to an arm)
    assert [c.step for c in run.checkpoints.all()] == [4]
    assert run.progress["breaker"]["level"] == "red"
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert 'id="breaker-stop"' in page and "Stopped by the breaker" in page
    assert "green -&gt; yellow at step 3" in page and "yellow -&gt; red at step 4" in page
    listing = admin_client.get(reverse("admin:training_trainingrun_changelist")).content.decode()
    assert "Stopped by the breaker" in listing
    # its level and share stand beside the measures in the behaviour table and behaviour.png
    assert "breaker level (0 green, 1 yellow, 2 red)</th><td>2.000 (step 4)" in page
    assert (tmp_path / "out" / "behaviour.png").is_file()

    # the list's Resume queues it again (the worker's send waits for the commit: none here)
    changelist = reverse("admin:training_trainingrun_changelist")
    admin_client.post(changelist, {"action": "resume", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.QUEUED and run.stop_reason == ""
    assert run_training.apply((run.pk,)).get() == TrainingRun.Status.DONE
    assert len(rediversified) == 1
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert 'id="breaker-stop"' not in page
    assert "resumed after the red stop at step 4" in page and "yellow -&gt; green" in page


def test_red_without_a_stop_rediversifies_at_once_and_trains_on(
    tiny_model, tmp_path, capsys, scripted, rediversified
):
    out = tmp_path / "out"
    path = tmp_path / "run.toml"
    path.write_text(CONFIG.format(model=tiny_model, out=out) + "red_stops = false\n")
    assert main(["run", str(path)]) == 0
    # judged after step 4's update, before its row is written: the next step meets the base
    assert rediversified == [{"rows_before": 3, "share": 0.25, "trained": True, "at_base": True}]
    assert [r["breaker/level"] for r in rows(out)] == [0, 0, 1, 2, 1, 0]
    events = read_events(out)
    assert [e["event"] for e in events] == [
        "fit",
        "transition",
        "transition",
        "rediversify",
        "transition",
        "transition",
    ]
    assert events[3]["step"] == 4 and "reset to its base" in events[3]["rediversified"]
    assert not events[2]["stops"] and "re-diversified at step 4" in capsys.readouterr().err


@pytest.mark.django_db
def test_a_launched_run_stopped_red_is_a_stop_not_a_failure(tmp_path, monkeypatch):
    """distributed.processes > 1: the task follows `accelerate launch`, whose ranks all exit
    with status 3 after the red stop; launch() reads the stop from breaker.jsonl and raises
    BreakerStopped (so the run is "stopped", not "failed") with the last checkpoint."""
    import subprocess
    import sys

    from agents.serving import process
    from training import tasks
    from training.config import parse_config
    from training.measures.breaker import BreakerStopped
    from training.models import TrainingRun

    out = tmp_path / "out"
    config = parse_config(
        {
            "name": "launched",
            "domain": "letters",
            "output_dir": str(out),
            "distributed": {"processes": 2},
        }
    )
    folder = out / "checkpoints" / "step-000004"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"step": 4}))
    (folder / "trainer_state.pt").write_bytes(b"")
    stop = {"event": "transition", "step": 4, "to": "red", "stops": True, "reason": "SCD high"}
    (out / "breaker.jsonl").write_text(json.dumps(stop) + "\n")
    exits = [sys.executable, "-c", f"import sys; sys.exit({STOPPED_EXIT})"]
    monkeypatch.setattr(process, "spawn", lambda command, *a, **k: subprocess.Popen(exits))
    run = TrainingRun.objects.create(name="launched", domain="letters")
    with pytest.raises(BreakerStopped) as stopped:
        tasks.launch(run, config, poll=0.05)
    assert (stopped.value.reason, stopped.value.step) == ("SCD high", 4)
    assert stopped.value.checkpoint == str(folder)
    # without the stop in breaker.jsonl the same exit is a failure
    (out / "breaker.jsonl").write_text(json.dumps(stop | {"stops": False}) + "\n")
    with pytest.raises(tasks.LaunchFailed):
        tasks.launch(run, config, poll=0.05)
