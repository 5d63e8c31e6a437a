"""The Celery task that runs a TrainingRun on the `training` queue and registers its checkpoints."""

import time
import traceback

from celery import shared_task
from django.utils import timezone

from .models import TrainingRun


class RunCancelled(Exception):
    pass


def progress_writer(run: TrainingRun, every: float = 1.0):
    """A progress callback that stores the latest figures (at most once a second) and stops
    the run when a researcher cancelled it."""
    last = [0.0]

    def write(progress: dict) -> None:
        if progress.get("checkpoint"):  # servable (and attachable to an arm) as soon as it exists
            run.register_checkpoint(progress["checkpoint"])
        now = time.monotonic()
        final = progress.get("step") == progress.get("total_steps")
        if now - last[0] < every and not final:
            return
        last[0] = now
        TrainingRun.objects.filter(pk=run.pk).update(progress=progress)
        if TrainingRun.objects.filter(pk=run.pk, status=TrainingRun.Status.CANCELLING).exists():
            raise RunCancelled()

    return write


# acks_late: a run whose worker died before it started is delivered again. A second delivery of
# a run already running or finished (a redelivery after a lost worker, or Redis's visibility
# timeout on a run longer than it) leaves it alone: a run never trains twice.
@shared_task(name="training.tasks.run_training", acks_late=True, reject_on_worker_lost=True)
def run_training(run_id: int) -> str:
    from training.run import train

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
        folders = train(config, progress_callback=progress_writer(run), show_progress=False)
        for folder in folders:
            run.register_checkpoint(folder)
        run.status = TrainingRun.Status.DONE
    except RunCancelled:
        run.status = TrainingRun.Status.CANCELLED
    except Exception:  # noqa: BLE001 - stored for the researcher; the checkpoints so far stay on disk
        run.status, run.error = TrainingRun.Status.FAILED, traceback.format_exc()
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "finished_at"])
    return run.status


def start(run: TrainingRun) -> None:
    from django.db import transaction

    def send():
        result = run_training.delay(run.pk)
        TrainingRun.objects.filter(pk=run.pk).update(task_id=result.id)

    transaction.on_commit(send)
