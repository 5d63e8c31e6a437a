"""The real server (uvicorn, its log kept) meeting faults and hostile clients: PostgreSQL lost in
the middle of a reply, a tab closed mid-reply, malformed frames and requests. Each is refused or
ridden out cleanly: at most a line in the log, never a traceback."""

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from studies.models import Message, StudyError
from studies.participation.arrive import arrive
from studies.participation.consent import give_consent
from tests.support.faulty_engine import REPLY, FaultyEngine
from tests.support.live_server import LoggedServer, Relay, postgres_address, relayed_database_url
from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.django_db(transaction=True)


def chatting(engine_url, pid):
    study = make_study(slug=f"live-{pid}", engine=engine_url)
    participant, _ = arrive(study, prolific(pid=pid))
    return give_consent(participant, True)


def open_socket(server, participant, **kwargs):
    url = server.url.replace("http", "ws") + f"/ws/p/{participant.token}/"
    return ws_connect(url, origin=server.url, open_timeout=30, **kwargs)


def until(socket, kind, timeout=30) -> list[dict]:
    events = []
    while True:
        events.append(json.loads(socket.recv(timeout=timeout)))
        if events[-1]["type"] == kind:
            return events


def stored(participant):
    return list(
        Message.objects.filter(conversation__participant=participant)
        .order_by("seq")
        .values_list("role", "content")
    )


@pytest.mark.parametrize(
    "pool_min",
    [
        "1",  # the pool's one connection is gone at once; its reconnection attempts back off
        "4",  # connections idle in the pool when PostgreSQL goes, still there when it returns
    ],
)
def test_postgresql_lost_mid_reply_is_said_at_once_and_the_first_reconnect_works(
    postgres, tmp_path, pool_min
):
    """PostgreSQL goes away while the reply streams: the reply cannot be stored, and the page
    hears so within the pool's timeout (it was 20.6 s: a pool wait for the reply, another for
    recording the problem), with Retry. While it is down, a reconnect is closed 1013 (try
    again). It stays down long enough for the pool's reconnection backoff to grow past a
    request's wait (1, 2, 4, 8, 16 s): the first reconnect after it returns still works."""
    relay = Relay(postgres_address())
    with FaultyEngine(["slow", "ok"], pace=0.2) as engine:
        participant = chatting(engine.url, "pg-lost")
        server = LoggedServer(
            tmp_path / "server.log", relayed_database_url(relay), PARLEY_DB_POOL_MIN=pool_min
        )
        try:
            with open_socket(server, participant) as socket:
                until(socket, "history")
                socket.send(json.dumps({"type": "message", "id": "lost1", "text": "Hello"}))
                assert [e["type"] for e in until(socket, "delta")] == ["ack", "start", "delta"]
                relay.cut()
                cut = time.monotonic()
                events = until(socket, "error")
                assert time.monotonic() - cut < 5 + 3  # the pool timeout, and the reply's end
                assert "reply" not in [e["type"] for e in events]
                assert events[-1]["retry"] and events[-1]["reply_to"] == "lost1"
                assert "could not be saved" in events[-1]["message"]
                assert until(socket, "status")[-1]["sent"] == 1

            with pytest.raises(ConnectionClosed) as closed, open_socket(server, participant) as s:
                s.recv(timeout=30)
            assert closed.value.rcvd.code == 1013

            time.sleep(max(0, cut + 18 - time.monotonic()))
            relay.restore()
            with open_socket(server, participant) as socket:
                history = until(socket, "history", timeout=10)[-1]
                assert [m["client_id"] for m in history["messages"]] == ["lost1"]
                # the message without a reply is answered on connecting, as after any drop
                assert until(socket, "reply", timeout=10)[-1]["message"]["content"] == REPLY
        finally:
            server.stop()
            relay.close()
        log = server.text()
        assert "Traceback" not in log, log
        assert stored(participant) == [("user", "Hello"), ("assistant", REPLY)]


@pytest.fixture
def server(transactional_db, tmp_path):
    server = LoggedServer(tmp_path / "server.log")
    yield server
    server.stop()


def test_a_tab_closed_mid_reply_is_a_normal_event(server):
    """No traceback and no problem for the researcher: the reply stops with the socket, and the
    message, stored, is answered when the participant comes back."""
    with FaultyEngine(["slow", "ok"], pace=0.2) as engine:
        participant = chatting(engine.url, "tab-closed")
        with open_socket(server, participant) as socket:
            until(socket, "history")
            socket.send(json.dumps({"type": "message", "id": "gone1", "text": "Hello"}))
            until(socket, "delta")
        server.wait_for("left mid-turn", also="Traceback")
        assert "Traceback" not in server.text(), server.text()
        assert not StudyError.objects.exists()
        assert stored(participant) == [("user", "Hello")]
        with open_socket(server, participant) as socket:
            assert until(socket, "reply")[-1]["message"]["content"] == REPLY


def test_an_invalid_utf8_frame_is_closed_1007_without_a_traceback(server):
    with FaultyEngine() as engine:
        participant = chatting(engine.url, "utf8")
        with pytest.raises(ConnectionClosed) as closed, open_socket(server, participant) as s:
            until(s, "history")
            s.send(b'{"type": "message", "id": "u", "text": "\xff\xfe"}', text=True)
            s.recv(timeout=10)
        assert closed.value.rcvd.code == 1007
    server.wait_for("Invalid UTF-8 sequence")  # uvicorn's one line (it was a traceback)
    assert "Traceback" not in server.text(), server.text()


def post_form(page, url, body: bytes) -> int:
    """POST `body` to `url` as a browser sends the form of `page`: with its CSRF cookie and
    token."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(page, timeout=30).read()
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    body = f"csrfmiddlewaretoken={token}&".encode() + body
    request = urllib.request.Request(url, body, {"Referer": page}, method="POST")
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


@pytest.mark.parametrize(
    "body, status",
    [
        ("&".join(f"f{n}=x" for n in range(1001)).encode(), 400),  # Django's field limit
        (b"comment=" + b"x" * 3_000_000, 413),  # over DATA_UPLOAD_MAX_MEMORY_SIZE
    ],
)
def test_oversized_forms_are_refused_in_one_log_line(server, body, status):
    study = make_study(slug="forms")
    participant, _ = arrive(study, prolific(pid="forms"))
    before = server.text().count("\n")
    page = f"{server.url}/p/{participant.token}/"
    assert post_form(page, page + "consent/", body) == status
    server.wait_for(f'"POST /p/[token]/consent/ HTTP/1.1" {status}')  # the token masked
    added = [line for line in server.text().splitlines()[before:] if '"GET ' not in line]
    assert "Traceback" not in server.text(), server.text()
    assert len(added) <= 2, added  # uvicorn's access line and at most one of ours


def test_the_access_log_keeps_no_prolific_ids(server):
    """SESSION_ID is the participant's credential now, and the page token another: uvicorn's
    access log wrote the arrival's whole query string and every page's path."""
    study = make_study(slug="quiet")
    query = urllib.parse.urlencode(
        prolific(pid="pid-never-logged", session_id="session-never-logged")
    )
    with urllib.request.urlopen(f"{server.url}/s/{study.slug}/?{query}", timeout=30) as page:
        assert page.status == 200  # followed to the consent page
    server.wait_for(f'"GET /s/{study.slug}/?[query redacted] HTTP/1.1" 302')
    # the participant's page is reached by its token alone: a credential too
    server.wait_for('"GET /p/[token]/ HTTP/1.1" 200')
    token = str(study.participants.get().token)
    assert "never-logged" not in server.text(), server.text()
    assert token not in server.text(), server.text()
    # and the participant's address as its network alone (personal data; no line needs it whole)
    server.wait_for('127.0.0.0/24 - "GET /p/[token]/ HTTP/1.1" 200')
    assert not re.search(r'127\.0\.0\.1:\d+ - "', server.text()), server.text()


def test_a_questionnaire_error_leaves_no_token_or_prolific_id_in_the_log(server):
    """25 of 113 tokens were in the web log: Django's own "Bad Request: /p/<token>/..." on every
    questionnaire sent with an error, beside uvicorn's access line; the chat's lines named
    Prolific ids. Through the real server, every line of it masked."""
    from tests.support.studies import at_questionnaire

    pid = "5f0c0ffee0ddba11c0ffee99"
    study = make_study(slug="asked")
    participant = at_questionnaire(study, pid, "a")
    page = f"{server.url}/p/{participant.token}/questionnaire/"
    assert post_form(f"{server.url}/p/{participant.token}/", page, b"helpful=") == 400
    server.wait_for('"POST /p/[token]/questionnaire/ HTTP/1.1" 400')
    server.wait_for("Bad Request: /p/[token]/questionnaire/")
    text = server.text()
    assert str(participant.token) not in text and pid not in text, text
