"""The Django project that ties parley's apps together."""

from .celery import app as celery_app

__all__ = ["celery_app"]
