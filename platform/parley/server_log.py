"""What the server's log may hold: no participant's credentials, no traceback for a client's fault.

Prolific's link carries PROLIFIC_PID, STUDY_ID and SESSION_ID in its query string, and uvicorn's
access log writes every request's query: it is cut from the line. A participant's pages and chat
socket are reached by their token alone (/p/<token>/, /ws/p/<token>/), and Django writes the path
of every 4xx (a questionnaire sent with an error: "Bad Request: /p/<token>/questionnaire/"): every
record is masked (studies/lib/credentials.py), whoever logged it. Requests and frames refused for
the client's own fault (Django's SuspiciousOperation: too many fields, a body too big; a text frame
that is not UTF-8) and refusals (PermissionDenied: an admin page the user may not open) are one
line, not a traceback.

The filters are named once, in settings.LOGGING's "filters", and put on its console handler;
`attach` puts the same ones on the handlers that uvicorn and Celery set up themselves.
"""

import ipaddress
import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.utils.module_loading import import_string

from studies.lib.credentials import mask

REDACTED = "?[query redacted]"
# What uvicorn logs with a traceback for a frame the client got wrong (it closes it 1007).
CLIENT_FRAME_ERRORS = ("Invalid UTF-8 sequence received from client",)
# Loggers whose arguments are request paths or request lines: a query string is cut whole.
REQUEST_LOGGERS = ("uvicorn.access", "uvicorn.error", "django.server")
# A participant's IP address is personal data (GDPR recital 30) and no line needs it whole: the
# access line keeps its network (IPv4 /24, IPv6 /48, as web analytics anonymise), no port.
ACCESS_LOGGER = "uvicorn.access"
KEPT_PREFIX = {4: 24, 6: 48}


def without_query(value):
    if not isinstance(value, str):
        return value
    if "?" in value:
        value = value.partition("?")[0] + REDACTED
    return value


def network_only(client: str) -> str:
    """uvicorn's client "host:port" (always with its port; IPv6 unbracketed), as its network:
    "203.0.113.0/24"."""
    host = client.rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a Unix socket's path, or a name: no address to keep
        return "-"
    return str(ipaddress.ip_network(f"{address}/{KEPT_PREFIX[address.version]}", strict=False))


def masked(value, paths: bool = False):
    """One log argument, masked; numbers stay numbers (uvicorn's access line formats %d)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return mask(without_query(value) if paths else value)
    pid = getattr(value, "prolific_pid", None)
    if pid is not None:  # a Participant: its str is the Prolific id
        return f"participant #{getattr(value, 'pk', '?')}"
    text = str(value)
    hidden = mask(text)
    return value if hidden == text else hidden


class RedactParticipants(logging.Filter):
    """Every record: its message, each argument and its traceback, masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        paths = record.name.startswith(REQUEST_LOGGERS)
        if record.name == ACCESS_LOGGER and isinstance(record.args, tuple) and record.args:
            record.args = (network_only(str(record.args[0])), *record.args[1:])
        record.msg = masked(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(masked(arg, paths) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {key: masked(arg, paths) for key, arg in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return True


class ClientFaultsInOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, SuspiciousOperation | PermissionDenied) or (
            record.exc_info and str(record.msg).startswith(CLIENT_FRAME_ERRORS)
        ):
            record.exc_info, record.exc_text = None, None
        return True


def configured_filters() -> list[logging.Filter]:
    """The filters of settings.LOGGING, in its order (faults first, then the masking)."""
    return [import_string(spec["()"])() for spec in settings.LOGGING["filters"].values()]


def attach(handlers) -> None:
    """settings.LOGGING's filters on `handlers` (once each)."""
    for handler in handlers:
        for new in configured_filters():
            if not any(type(f) is type(new) for f in handler.filters):
                handler.addFilter(new)


def install() -> None:
    """uvicorn's loggers have uvicorn's own handlers, configured before the app is imported (in
    every worker process): the filters go on those handlers ("uvicorn" holds uvicorn.error's)."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        attach(logging.getLogger(name).handlers)
