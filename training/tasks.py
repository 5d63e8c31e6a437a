"""The Celery task that runs a TrainingRun on the `training` queue and registers its checkpoints.

One process trains in the worker; more (distributed.processes > 1) are started through the same
launcher as on the command line (`accelerate launch ... -m training run`, as a child process by
agents/serving/process.py like the servers), followed through the progress file rank 0 writes,
and a failed launch stores which rank failed and why.
"""

import contextlib
import json
import logging
import threading
import time
import traceback
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.db import connection
from django.utils import timezone

from .models import TrainingRun


class RunCancelled(Exception):
    pass


log = logging.getLogger(__name__)


def progress_writer(run: TrainingRun, every: float = 1.0):
    """A progress callback that stores the latest figures (at most once a second, but at once
    when a new collapse warning came or the step moved to another phase) and stops the run when
    a researcher cancelled it. The run page shows the progress's `warnings`, every one so far
    (training/measures/diversity.py), and where the step is (`current`: rollouts done of total)."""
    last, warned, phase = [0.0], [0], [None]

    def write(progress: dict) -> None:
        if progress.get("checkpoint"):  # servable (and attachable to an arm) as soon as it exists
            run.register_checkpoint(progress["checkpoint"])
        now = time.monotonic()
        final = progress.get("step") == progress.get("total_steps")
        new_warning = len(progress.get("warnings") or []) > warned[0]
        current = progress.get("current") or {}
        new_phase = (current.get("step"), current.get("phase")) != phase[0]
        if now - last[0] < every and not final and not new_warning and not new_phase:
            return
        last[0], warned[0] = now, len(progress.get("warnings") or [])
        phase[0] = (current.get("step"), current.get("phase"))
        TrainingRun.objects.filter(pk=run.pk).update(progress=progress, heartbeat_at=timezone.now())
        if TrainingRun.objects.filter(pk=run.pk, status=TrainingRun.Status.CANCELLING).exists():
            raise RunCancelled()

    return write


# acks_late: a run whose worker died before it started is delivered again. A second delivery of
# a run already running or finished (a redelivery after a lost worker, or Redis's visibility
# timeout on a run longer than it) leaves it alone: a run never trains twice.
@shared_task(name="training.tasks.run_training", acks_late=True, reject_on_worker_lost=True)
def run_training(run_id: int) -> str:
    from training.measures.breaker import BreakerStopped
    from training.trainer.loop import train

    run = TrainingRun.objects.get(pk=run_id)
    if run.status != TrainingRun.Status.QUEUED:
        return run.status
    config = run.config()
    run.status, run.started_at, run.output_dir = (
        TrainingRun.Status.RUNNING,
        timezone.now(),
        str(config.run_dir()),
    )
    # One conditional UPDATE claims the run, so two deliveries at once cannot both train it.
    claimed = TrainingRun.objects.filter(pk=run.pk, status=TrainingRun.Status.QUEUED).update(
        status=run.status, started_at=run.started_at, output_dir=run.output_dir
    )
    if not claimed:
        return TrainingRun.objects.get(pk=run.pk).status
    try:
        with heartbeat(run):
            if config.distributed.processes > 1:
                folders = launch(run, config)
            else:
                write = progress_writer(run)
                folders = train(
                    config, progress_callback=write, within_step=write, show_progress=False
                )
        for folder in folders:
            run.register_checkpoint(folder)
        run.status = TrainingRun.Status.DONE
    except RunCancelled:
        run.status = TrainingRun.Status.CANCELLED
    except BreakerStopped as stop:  # red: its checkpoint stays registered, the run resumable
        if stop.checkpoint:
            run.register_checkpoint(stop.checkpoint)
        run.status, run.stop_reason = TrainingRun.Status.STOPPED, stop.reason
    except Exception:  # noqa: BLE001 - stored for the researcher; the checkpoints so far stay on disk
        run.status, run.error = TrainingRun.Status.FAILED, traceback.format_exc()
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "stop_reason", "finished_at"])
    return run.status


@contextlib.contextmanager
def heartbeat(run: TrainingRun):
    """While the run trains, its worker says so every quarter of PARLEY_TRAINING_LOST_AFTER
    (a thread: one step can take many minutes without a progress write); a run whose beats
    stop has lost its worker (TrainingRun.worker_lost)."""
    every, stop = settings.PARLEY_TRAINING_LOST_AFTER / 4, threading.Event()

    def beat():
        try:  # the claim's started_at is the first beat
            while not stop.wait(every):
                try:
                    TrainingRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now())
                except Exception:  # a database away for a moment: the next beat tries again
                    log.exception("training run %s: could not store its heartbeat", run.pk)
        finally:
            connection.close()  # this thread's own connection

    thread = threading.Thread(target=beat, name=f"heartbeat-{run.pk}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)  # a beat held up by the database must not hold the task up


class LaunchFailed(RuntimeError):
    pass


def launch(run: TrainingRun, config, poll: float = 1.0) -> list[Path]:
    """Train `config` in distributed.processes processes started by accelerate; returns the
    complete checkpoints. A failure raises LaunchFailed with each failed rank's traceback
    (training/rl/distributed.py); a cancelled run stops the whole process group."""
    from agents.serving.process import spawn, stop
    from training.measures.breaker import BreakerStopped, last_stop
    from training.rl.distributed import launch_command, read_failures
    from training.trainer.checkpoint import list_checkpoints

    run_dir = config.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file, progress_file = run_dir / "launch-config.json", run_dir / "progress.json"
    config_file.write_text(json.dumps(config.to_dict(), default=str))
    progress_file.unlink(missing_ok=True)
    command = launch_command(
        config_file, config.distributed.processes, ["--progress-file", str(progress_file)]
    )
    write, seen = progress_writer(run), None
    # the serving launcher's: a process group of its own (cancelling stops the launcher and
    # every rank, and nothing else), its output appended to launch.log, and it dies with this
    # worker (a lost worker's ranks would otherwise train on unseen beside a resumed run)
    process = spawn(command, run_dir / "launch.log", append=True, own_group=True)
    try:
        while process.poll() is None:
            time.sleep(poll)
            progress = _read_json(progress_file)
            if progress and progress != seen:
                seen = progress
                write(progress)
            elif TrainingRun.objects.filter(
                pk=run.pk, status=TrainingRun.Status.CANCELLING
            ).exists():
                raise RunCancelled()
    except BaseException:
        stop(process)  # SIGTERM to the group, SIGKILL to what is left after 10 s
        raise
    progress = _read_json(progress_file)
    if progress and progress != seen:
        write(progress)
    red = last_stop(run_dir)
    if process.returncode and red is not None:  # every rank stopped red on purpose
        found = list_checkpoints(run_dir)
        raise BreakerStopped(red["reason"], red["step"], str(found[-1]) if found else "")
    if process.returncode:
        why = read_failures(run_dir) or _tail(run_dir / "launch.log")
        raise LaunchFailed(
            f"{config.distributed.processes} processes, exit {process.returncode}\n{why}"
        )
    return list_checkpoints(run_dir)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.is_file() else ""


def start(run: TrainingRun) -> None:
    from django.db import transaction

    def send():
        result = run_training.delay(run.pk)
        TrainingRun.objects.filter(pk=run.pk).update(task_id=result.id)

    transaction.on_commit(send)
