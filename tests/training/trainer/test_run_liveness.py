"""A run's signs of life: progress within a step (rollouts done of total) from the trainer,
and a run whose Celery worker died (killed outright mid-run) shown as "worker lost" on its page
with what to do, then resumed from the list."""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from parley.celery import worker_args

from tests.support.processes import REPO, child_env
from training import tasks
from training.config import parse_config
from training.models import TrainingRun
from training.tasks import run_training, start
from training.trainer.loop import train

SAME_WORDS = {"name": "steady", "kind": "scripted", "script": "steady"}
LOST_AFTER = 6  # seconds without a heartbeat: the worker beats every 1.5 s
# This test's worker alone may take the run: the suite's shared worker serves `training` too, and
# would train it on (500 steps) after this one is killed.
OWN_QUEUE = f"training-lost-{os.getpid()}"


class OnOwnQueue:
    """training.tasks.run_training as start() and the admin's Resume send it: to OWN_QUEUE."""

    def delay(self, *args):
        return run_training.apply_async(args, queue=OWN_QUEUE)


def tiny_settings(tiny_model, out, **more):
    return {
        "base_model": str(tiny_model),
        "steps": 1,
        "batch_tasks": 2,
        "group_size": 2,
        "max_new_tokens": 4,
        "max_turns": 2,
        "simulator": SAME_WORDS,
        "heldout": [],
        "tasks": {"max_eval": 1},
        "output_dir": str(out),
        "threads": 1,
        **more,
    }


def test_progress_within_a_step_counts_rollouts(tiny_model, tmp_path, letters):
    sent = []
    config = parse_config(
        {
            "name": "inside",
            "domain": "letters",
            **tiny_settings(tiny_model, tmp_path / "out", steps=2),
        }
    )
    ends = []
    train(config, ends.append, domain=letters, show_progress=False, within_step=sent.append)
    assert [p["step"] for p in ends] == [1, 2] and not any("current" in p for p in ends)
    inside = [
        (
            p["current"]["step"],
            p["current"]["phase"],
            p["current"]["rollouts_done"],
            p["current"]["turns_done"],
        )
        for p in sent
        if "current" in p
    ]
    # every turn moves it (2 rollouts a task, 2 turns each, the pair in step): the turn before
    # either conversation ends is said too, where the count of ended ones alone stood still
    per_step = [
        ("rollouts", 0, 0),
        ("rollouts", 0, 2),
        ("rollouts", 2, 4),
        ("rollouts", 2, 6),
        ("rollouts", 4, 8),
        ("update", 4, 8),
    ]
    assert inside == [(step, *row) for step in (1, 2) for row in per_step]
    assert {p["current"]["rollouts_total"] for p in sent if "current" in p} == {4}
    # within step 2, the figures of step 1 stay; a step's end sends them without `current`
    step_two = next(p for p in sent if p.get("current", {}).get("step") == 2)
    assert step_two["step"] == 1 and "reward" in step_two


def start_worker(log) -> subprocess.Popen:
    """A real Celery worker on this test's own queue, beating every LOST_AFTER / 4 seconds."""
    process = subprocess.Popen(
        [
            sys.executable,
            *worker_args("--pool", "solo", "-n", f"lost-{os.getpid()}@%h", queues=(OWN_QUEUE,)),
        ],
        cwd=REPO,
        env=child_env(PARLEY_TRAINING_LOST_AFTER=str(LOST_AFTER)),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return process


def wait_until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    pytest.fail(f"no {what} in {seconds:.0f}s")


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_worker_is_killed_is_shown_lost_and_resumed(
    tiny_model, tmp_path, admin_client, settings, monkeypatch
):
    settings.PARLEY_TRAINING_LOST_AFTER = LOST_AFTER
    monkeypatch.setattr(tasks, "run_training", OnOwnQueue())
    run = TrainingRun.objects.create(
        name="killed",
        domain="p4g",
        regime="single",
        settings=tiny_settings(tiny_model, tmp_path / "out", steps=500),
    )
    log = tmp_path / "worker.log"
    worker = start_worker(log)
    try:
        start(run)

        def training():
            run.refresh_from_db()
            return "current" in (run.progress or {}) and run.heartbeat_at

        wait_until(training, 120, f"progress within a step (worker log: {log})")
        worker.send_signal(signal.SIGKILL)  # no cleanup runs: as the OOM killer does it
        worker.wait()
    finally:
        worker.kill()
        worker.wait()
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.RUNNING  # nobody was left to say otherwise
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    current = run.progress.get("current")  # None only between a step's end and the next's start
    shown = f"step {current['step']}: " if current else f"{run.progress['step']}/500"
    assert shown in page.content.decode()
    wait_until(lambda: TrainingRun.objects.get(pk=run.pk).worker_lost(), 30, "lost worker")

    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[run.pk]))
    page = page.content.decode()
    assert "Running: worker lost" in page
    assert "Worker lost: no heartbeat from the Celery worker running this run" in page
    assert "Start a worker on the `training` queue" in page
    live = admin_client.get(reverse("admin:training_trainingrun_progress", args=[run.pk])).json()
    assert "Worker lost" in live["text"] and live["active"]
    listing = admin_client.get(reverse("admin:training_trainingrun_changelist")).content.decode()
    assert "Running: worker lost" in listing

    task_before = run.task_id
    admin_client.post(
        reverse("admin:training_trainingrun_changelist"),
        {"action": "resume", "_selected_action": [run.pk]},
    )
    run.refresh_from_db()
    assert run.status == TrainingRun.Status.QUEUED and run.task_id != task_before
    assert not run.worker_lost()
    TrainingRun.objects.filter(pk=run.pk).update(status=TrainingRun.Status.CANCELLED)


@pytest.mark.django_db
def test_a_fresh_heartbeat_is_alive_and_a_stale_one_lost(admin_client, settings):
    settings.PARLEY_TRAINING_LOST_AFTER = 120
    now = timezone.now()
    alive = TrainingRun.objects.create(
        name="alive",
        status=TrainingRun.Status.RUNNING,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(seconds=60),
        progress={
            "total_steps": 10,
            "current": {
                "step": 1,
                "phase": "rollouts",
                "rollouts_done": 3,
                "rollouts_total": 8,
                "turns_done": 17,
            },
        },
    )
    lost = TrainingRun.objects.create(
        name="lost",
        status=TrainingRun.Status.RUNNING,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(minutes=5),
    )
    done = TrainingRun.objects.create(
        name="done", status=TrainingRun.Status.DONE, heartbeat_at=now - timedelta(days=1)
    )
    assert not alive.worker_lost() and lost.worker_lost() and not done.worker_lost()
    page = admin_client.get(reverse("admin:training_trainingrun_change", args=[alive.pk]))
    assert "0/10; step 1: rollouts 3 of 8, 17 turns taken" in page.content.decode()
    assert "worker lost" not in page.content.decode()

    # resuming a run whose worker is alive is refused; cancelling a lost one ends it at once
    changelist = reverse("admin:training_trainingrun_changelist")
    admin_client.post(changelist, {"action": "resume", "_selected_action": [alive.pk]})
    admin_client.post(changelist, {"action": "cancel", "_selected_action": [lost.pk]})
    alive.refresh_from_db(), lost.refresh_from_db()
    assert alive.status == TrainingRun.Status.RUNNING
    assert lost.status == TrainingRun.Status.CANCELLED and lost.finished_at is not None
