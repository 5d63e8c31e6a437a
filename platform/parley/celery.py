"""The Celery app: queues `default`, `analysis`, `training`."""

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")

QUEUES = ("default", "analysis", "training")  # settings route studies' and training's tasks here

app = Celery("parley")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery beat (`celery -A parley beat`) starts these periodic tasks.
app.conf.beat_schedule = {
    **(app.conf.beat_schedule or {}),
    # Prolific submissions both ways (studies/prolific_sync.py); the webhook is the fast path.
    "prolific-sync": {
        "task": "studies.tasks.sync_prolific",
        "schedule": settings.PROLIFIC_SYNC_INTERVAL,
    },
}


def worker_args(*options: str) -> list[str]:
    """`python -m celery ...` arguments of a worker on every queue (the demo's and the tests')."""
    return ["-m", "celery", "-A", "parley", "worker", "-Q", ",".join(QUEUES), *options]


@app.task(name="parley.health")
def health() -> dict:
    """Proof that a worker runs with the standard library's `platform`, not our folder."""
    import platform

    return {
        "platform_file": getattr(platform, "__file__", None),
        "python": platform.python_version(),
    }
