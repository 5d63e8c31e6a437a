"""PostgreSQL briefly unreachable (a restart, a failover, the pool run dry): participants see a
page that tries again by itself (503, Retry-After), never a server error."""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.db import connection
from django.db.utils import OperationalError
from django.urls import reverse

from agents.serving.process import free_port
from tests.support.processes import REPO
from tests.support.studies import GOOD_ANSWERS, at_questionnaire, make_study, prolific


def refuse_connections(monkeypatch):
    """From now on every query fails as it does while the server restarts or the pool is dry."""

    def refused():
        raise OperationalError("connection refused: the database server is restarting")

    monkeypatch.setattr(connection, "ensure_connection", refused)


@pytest.mark.django_db
def test_a_participant_sees_a_retrying_page_not_a_server_error(client, monkeypatch):
    study = make_study()
    participant = at_questionnaire(study, "outage", "a")
    refuse_connections(monkeypatch)

    page = client.get(reverse("studies:participant", args=[participant.token]))
    assert page.status_code == 503 and page["Retry-After"] == "5"
    body = page.content.decode()
    assert '<meta http-equiv="refresh" content="5">' in body and "tries again by itself" in body

    sent = client.post(reverse("studies:questionnaire", args=[participant.token]), GOOD_ANSWERS)
    assert sent.status_code == 503 and sent["Retry-After"] == "5"
    # A reload would lose the answers: the page asks to go back and send them again instead.
    assert "http-equiv" not in sent.content.decode() and "go back" in sent.content.decode()

    arrival = client.get(f"/s/{study.slug}/", prolific(pid="new"))
    assert arrival.status_code == 503


def test_the_real_server_answers_503_while_postgresql_is_down(tmp_path):
    """uvicorn with PostgreSQL at a port where nothing listens: the pool cannot connect, and the
    participant's page is the retrying page, not a traceback."""
    port, dead = free_port(), free_port()
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://postgres@127.0.0.1:{dead}/gone",
        PARLEY_DB_POOL_MIN="0",
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "parley.asgi:application", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:  # listening is enough: /healthz itself reports the database down
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
        query = urllib.parse.urlencode(prolific(pid="during-outage"))
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"{url}/s/any-study/?{query}", timeout=30)
        assert answer.value.code == 503 and answer.value.headers["Retry-After"] == "5"
        assert "tries again by itself" in answer.value.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=10)
