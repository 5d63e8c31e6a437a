"""A database that cannot be reached answers 503 with a page that tries again by itself, not 500.

PostgreSQL restarting or failing over, or the connection pool running dry, lasts seconds: a
participant who sees "please wait, retrying" stays; one who sees a server error often leaves.
"""

import logging

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.template.loader import render_to_string

from studies.lib.credentials import mask_path

log = logging.getLogger(__name__)

OUTAGE = (OperationalError, InterfaceError)  # connection refused, lost, pool timeout; not bad SQL


def retry_after() -> int:
    return settings.PARLEY_DB_RETRY_AFTER


def retrying_response(request) -> HttpResponse:
    """503 with Retry-After; the page reloads itself, except after a form was sent (a reload
    would lose the answers: the page asks the participant to go back and send them again)."""
    seconds = retry_after()
    # Rendered without the request: context processors might need the database that is down.
    page = render_to_string(
        "studies/retrying.html",
        {"retry_after": seconds, "reload": request.method in ("GET", "HEAD")},
    )
    response = HttpResponse(page, status=503)
    response["Retry-After"] = str(seconds)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseUnavailableMiddleware:
    """Near the top of MIDDLEWARE; it answers for the views (participants' pages use no session,
    so no middleware below touches the database on their path)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, OUTAGE):
            log.warning(
                "database unavailable on %s %s: %s",
                request.method,
                mask_path(request.path),  # a participant's path holds their token
                exception,
            )
            return retrying_response(request)
        return None
