"""The Celery app: queues `default`, `analysis`, `training`."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")

QUEUES = ("default", "analysis", "training")  # settings route studies' and training's tasks here
# A training run holds its worker for hours: it gets a worker of its own, so an analysis or a
# bot run never waits behind it (the demo and deploy/ start both).
SERVICE_QUEUES = ("default", "analysis")
TRAINING_QUEUES = ("training",)

app = Celery("parley")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def mask_participants(logger, **kwargs) -> None:
    """A worker sets up its own log handlers in place of settings.LOGGING's: they get its
    filters too (no participant's token or Prolific id in a worker's log)."""
    from parley import server_log

    server_log.attach(logger.handlers)


def worker_args(*options: str, queues: tuple[str, ...] = QUEUES) -> list[str]:
    """`python -m celery ...` arguments of a worker on `queues` (every queue unless told)."""
    return ["-m", "celery", "-A", "parley", "worker", "-Q", ",".join(queues), *options]


def beat_args(schedule_file: str, *options: str) -> list[str]:
    """`python -m celery ...` arguments of Celery beat, which sends the periodic tasks of
    settings.CELERY_BEAT_SCHEDULE; `schedule_file` keeps its last run times."""
    return ["-m", "celery", "-A", "parley", "beat", "--schedule", schedule_file, *options]


@app.task(name="parley.health")
def health() -> dict:
    """Proof that a worker runs with the standard library's `platform`, not our folder."""
    import platform

    return {
        "platform_file": getattr(platform, "__file__", None),
        "python": platform.python_version(),
    }
