"""What the server's log may hold: no participant's credentials, no traceback for a client's fault.

Prolific's link carries PROLIFIC_PID, STUDY_ID and SESSION_ID in its query string, and uvicorn's
access log writes every request's query: it is cut from the line. A participant's pages and chat
socket are reached by their token alone (/p/<token>/, /ws/p/<token>/): it is masked too. Requests and frames refused
for the client's own fault (Django's SuspiciousOperation: too many fields, a body too big; a
text frame that is not UTF-8) are one line, not a traceback.
"""

import logging
import re

from django.core.exceptions import SuspiciousOperation

REDACTED = "?[query redacted]"
PARTICIPANT_TOKEN = re.compile(r"^(/ws)?/p/[^/?\s]+")  # a path's start only
# What uvicorn logs with a traceback for a frame the client got wrong (it closes it 1007).
CLIENT_FRAME_ERRORS = ("Invalid UTF-8 sequence received from client",)


def without_query(value):
    if not isinstance(value, str):
        return value
    if "?" in value:
        value = value.partition("?")[0] + REDACTED
    return PARTICIPANT_TOKEN.sub(r"\1/p/[token]", value)


class RedactQueryStrings(logging.Filter):
    """On uvicorn.access ('%s - "%s %s HTTP/%s" %d') and uvicorn.error (its WebSocket lines):
    every argument with a query string loses it, and a participant's token its value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(without_query(arg) for arg in record.args)
        return True


class ClientFaultsInOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, SuspiciousOperation) or (
            record.exc_info and str(record.msg).startswith(CLIENT_FRAME_ERRORS)
        ):
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """uvicorn's loggers have uvicorn's own handlers, configured before the app is imported (in
    every worker process): the filters go on the loggers themselves. Django's records reach the
    root handler of settings.LOGGING, which has ClientFaultsInOneLine."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        for kind in (RedactQueryStrings, ClientFaultsInOneLine):
            if not any(isinstance(f, kind) for f in logger.filters):
                logger.addFilter(kind())
