"""The Celery app: queues `default`, `analysis`, `training`."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "parley.settings")

app = Celery("parley")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="parley.health")
def health() -> dict:
    """Proof that a worker runs with the standard library's `platform`, not our folder."""
    import platform

    return {
        "platform_file": getattr(platform, "__file__", None),
        "python": platform.python_version(),
    }
