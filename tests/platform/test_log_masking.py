"""What the web log may hold (issue 36 point 5): no participant's token and no Prolific id, whoever
logs the line (Django's own request lines, the outage middleware, the rate limiter, the chat), and
a refusal in one line. Read from the real console handler of settings.LOGGING, so the filters it
carries are the ones under test; the same through uvicorn is in
tests/studies/faults/test_live_server_faults.py."""

import io
import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.db import OperationalError
from django.test import RequestFactory
from django.urls import reverse
from parley import server_log

from studies.participation import ratelimit
from studies.participation.middleware import DatabaseUnavailableMiddleware
from tests.support.studies import at_questionnaire, make_study

pytestmark = pytest.mark.django_db

PID = "5f0c0ffee0ddba11c0ffee42"  # a Prolific id: 24 hexadecimal digits


@pytest.fixture
def web_log():
    """The text the configured console handler writes while the test runs."""
    [console] = [
        handler
        for handler in logging.getLogger().handlers
        if any(isinstance(f, server_log.RedactParticipants) for f in handler.filters)
    ]
    written = io.StringIO()
    before = console.setStream(written)
    yield written.getvalue
    console.setStream(before)


def test_a_questionnaire_sent_with_an_error_logs_no_token(client, web_log):
    """Django logs the path of every 4xx ("Bad Request: /p/<token>/questionnaire/")."""
    study = make_study()
    participant = at_questionnaire(study, PID, "a")
    assert client.post(f"/p/{participant.token}/questionnaire/", {}).status_code == 400
    text = web_log()
    assert "Bad Request: /p/[token]/questionnaire/" in text, text
    assert str(participant.token) not in text


def test_the_outage_and_the_rate_limiter_log_no_token(web_log, monkeypatch):
    study = make_study()
    participant = at_questionnaire(study, PID, "a")
    token = str(participant.token)
    request = RequestFactory().post(f"/p/{token}/questionnaire/")
    DatabaseUnavailableMiddleware(lambda r: None).process_exception(
        request, OperationalError("connection refused")
    )

    def unreachable():
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(ratelimit, "limiter", unreachable)
    assert ratelimit.message_allowed(token, "203.0.113.9")  # let through, and said so
    text = web_log()
    assert "database unavailable on POST /p/[token]/questionnaire/" in text, text
    assert "rate limit storage unavailable; letting message events through" in text, text
    assert token not in text


def test_no_record_names_a_participant_by_prolific_id_or_token(web_log):
    """Whatever a module logs: a Participant argument (its str is the Prolific id), a Prolific
    link's query, a Prolific id in an error's text, a token in a traceback."""
    study = make_study()
    participant = at_questionnaire(study, PID, "a")
    token = str(participant.token)
    log = logging.getLogger("studies.chat.consumers")
    log.warning("agent reply failed for %s", participant)
    log.warning("arrived from /s/x/?PROLIFIC_PID=someone-else&STUDY_ID=st&SESSION_ID=se")
    log.warning("Prolific refused: %s", f"{PID} did not take part")
    try:
        raise ValueError(f"no page at http://host/p/{token}/done/")
    except ValueError:
        log.exception("participant page failed")
    text = web_log()
    assert f"agent reply failed for participant #{participant.pk}" in text, text
    assert "PROLIFIC_PID=[redacted]&STUDY_ID=[redacted]&SESSION_ID=[redacted]" in text, text
    assert "[prolific id] did not take part" in text and "http://host/p/[token]/done/" in text
    for secret in (PID, token, "someone-else"):
        assert secret not in text, secret


def test_a_refused_admin_page_is_one_line(client, web_log):
    """716 403s each logged Django's 45-line traceback of PermissionDenied."""
    study = make_study()
    viewer = User.objects.create(username="viewer", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_study"))
    client.force_login(viewer)
    url = reverse("admin:studies_study_switch", args=[study.pk])
    assert client.post(url, {"to": "paused"}).status_code == 403
    text = web_log()
    assert f"Forbidden (Permission denied): {url}" in text, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text


def test_a_worker_log_gets_the_same_filters():
    """Celery replaces the root's handlers with its own when a worker starts: its
    after_setup_logger signal puts settings.LOGGING's filters on them."""
    from parley.celery import mask_participants

    written = io.StringIO()
    logger = logging.Logger("worker")
    logger.addHandler(logging.StreamHandler(written))
    mask_participants(logger=logger)
    logger.warning("page /p/0b7a5d6e-4f43-4a57-9a51-6a6f3b1f0c11/ for %s", PID)
    assert written.getvalue() == "page /p/[token]/ for [prolific id]\n"
