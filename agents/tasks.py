"""The periodic health check of the model endpoints (Celery beat, every
PARLEY_ENDPOINT_CHECK_INTERVAL seconds): each replica's /health and /v1/models, stored."""

import logging

from celery import shared_task

from .models import ModelEndpoint

log = logging.getLogger(__name__)


@shared_task(name="agents.tasks.check_endpoints")
def check_endpoints() -> dict[str, str]:
    """Probe every endpoint's replicas and store what they answered; returns each endpoint's
    colour (green, amber, red) by name. One endpoint's failure does not stop the others."""
    colours = {}
    for endpoint in ModelEndpoint.objects.prefetch_related("replicas"):
        try:
            colours[endpoint.name] = endpoint.refresh_health().health()
        except Exception:
            log.exception("checking endpoint %s failed", endpoint.name)
            colours[endpoint.name] = "error"
    return colours
