from pathlib import Path

from django.apps import AppConfig
from django.conf import settings


class ParleyConfig(AppConfig):
    """The project itself: makes the data folders when a process starts, so importing the
    settings (a test collecting, a linter) writes nothing to disk."""

    name = "parley"

    def ready(self):
        folders = [settings.DATA_DIR, settings.STATIC_ROOT]
        options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
        folders += [
            options[k]
            for k in ("data_folder_in", "processed_folder", "control_folder")
            if k in options
        ]
        backend = settings.CELERY_RESULT_BACKEND
        if backend.startswith("file://"):
            folders.append(backend.removeprefix("file://"))
        for folder in folders:
            Path(folder).mkdir(parents=True, exist_ok=True)
