"""Logs keep no identifiers (issue 39 point 6): a whole study's flow (arrival from a Prolific link,
consent, a chat with the real embedded engine over the chat socket, the questionnaire, the
completion redirect), and a rater's, with every log record captured twice: as the server's
console writes it (settings.LOGGING's filters), and as each module emitted it before any filter.
Neither holds the participant's token or Prolific id. The Prolific id is not Prolific's 24
hexadecimal digits, so the console's mask cannot hide a line that names it: the modules
themselves must not."""

import io
import logging

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse
from parley import server_log

from studies.models import AnnotationSetup, Participant, RatedConversation
from studies.participation import ratelimit
from tests.support.studies import GOOD_ANSWERS, connect, make_study, prolific, receive_until

# Django's own lines about a request name its path (a 4xx: "Bad Request: /p/<token>/..."): the
# console masks them (asserted below); every other module must not name anyone at all.
FRAMEWORK_PATH_LOGGERS = ("django.request", "django.server", "uvicorn")

PID = "logflowPID3Xq8"


class Everything(logging.Handler):
    """Every record as its module emitted it, before any filter (first among the root's
    handlers: the console's filters change the record they pass)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        if record.name.startswith(FRAMEWORK_PATH_LOGGERS):
            return
        self.lines.append(record.getMessage())
        if record.exc_info:
            self.lines.append(logging.Formatter().formatException(record.exc_info))


@pytest.fixture
def logs():
    # every handler of the root that carries the masking (one under settings.LOGGING; an earlier
    # test in the same process may have left another, e.g. a worker's set up in process)
    consoles = [
        handler
        for handler in logging.getLogger().handlers
        if any(isinstance(f, server_log.RedactParticipants) for f in handler.filters)
        and isinstance(handler, logging.StreamHandler)
    ]
    assert consoles, "settings.LOGGING's console handler is not on the root logger"
    written = io.StringIO()
    before = [console.setStream(written) for console in consoles]
    raw = Everything()
    root = logging.getLogger()
    level = root.level
    root.handlers.insert(0, raw)
    root.setLevel(logging.DEBUG)
    yield lambda: (written.getvalue(), "\n".join(raw.lines))
    root.setLevel(level)
    root.removeHandler(raw)
    for console, stream in zip(consoles, before, strict=True):
        console.setStream(stream)


def arrive(client, slug, pid, session):
    response = client.get(f"/s/{slug}/", prolific(pid=pid, session_id=session))
    assert response.status_code == 302
    participant = Participant.objects.get(study__slug=slug, prolific_pid=pid)
    page = reverse("studies:participant", args=[participant.token])
    assert client.get(page).status_code == 200
    client.post(reverse("studies:consent", args=[participant.token]), {"decision": "accept"})
    participant.refresh_from_db()
    return participant


def finish(client, participant):
    page = reverse("studies:participant", args=[participant.token])
    assert client.get(page).status_code == 200
    answers = {**GOOD_ANSWERS, "comment": "It went fine."}
    # A wrong answer first (a 400 that Django logs with its path), then the right ones.
    client.post(reverse("studies:questionnaire", args=[participant.token]), {"helpful": "99"})
    client.post(reverse("studies:questionnaire", args=[participant.token]), answers)
    done = client.get(reverse("studies:done", args=[participant.token]))
    assert done.status_code == 302 and "prolific.com" in done["Location"]
    participant.refresh_from_db()
    assert participant.status == Participant.Status.COMPLETED


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_whole_study_flow_logs_no_token_and_no_prolific_id(engine_url, sockets, logs):
    client = Client()
    await sync_to_async(make_study)(slug="logged", engine=engine_url)
    participant = await sync_to_async(arrive)(client, "logged", PID, "SESSIONlog1")
    chat = await connect(sockets, participant)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "m-1", "text": "Hello there"})
    await receive_until(chat, "status", timeout=120)
    await chat.send_json_to({"type": "end"})
    await receive_until(chat, "redirect")
    await chat.disconnect()
    await sync_to_async(finish)(client, participant)

    # A rater in an annotation study, through the rating pages.
    pool = await sync_to_async(make_study)(slug="logged-pool", arms=("raters",))
    await sync_to_async(AnnotationSetup.objects.create)(
        study=pool, raters_per_conversation=1, conversations_per_rater=1, gold_per_rater=0
    )
    await sync_to_async(RatedConversation.objects.create)(
        study=pool, source="simulator", transcript=[{"speaker": "user", "text": "Hi"}]
    )
    rater = await sync_to_async(arrive)(client, "logged-pool", "raterPIDlog2", "SESSIONlog2")
    rate = reverse("studies:rate", args=[rater.token])
    data = {"position": 1, **GOOD_ANSWERS, "real_person": "real", "realism_confidence": "3"}
    assert (await sync_to_async(client.post)(rate, data)).status_code == 302

    # One whose arm's engine is down: the consumer logs the failure (an error line).
    await sync_to_async(make_study)(slug="logged-down", arms=("down",))
    stranded = await sync_to_async(arrive)(client, "logged-down", "downPIDlog3", "SESSIONlog3")
    chat = await connect(sockets, stranded)
    await chat.receive_json_from()
    await chat.send_json_to({"type": "message", "id": "m-1", "text": "Anyone?"})
    await receive_until(chat, "error", timeout=60)
    await chat.disconnect()

    written, emitted = logs()
    assert "agent reply failed" in emitted, "the error line was not captured:\n" + emitted
    assert "agent reply failed" in written, written
    secrets = [PID, "raterPIDlog2", "downPIDlog3", "SESSIONlog1", "SESSIONlog2", "SESSIONlog3"]
    for who in (participant, rater, stranded):
        secrets += [str(who.token), who.token.hex]
    for text, what in ((written, "the console"), (emitted, "a module's record")):
        named = [secret for secret in secrets if secret in text]
        assert named == [], f"{what} names {named}:\n{text[-3000:]}"
    assert "/p/[token]/questionnaire/" in written  # the 400 was logged, masked


def test_the_rate_limiter_counts_by_a_keyed_hash_of_the_token(db):
    study = make_study(slug="limited")
    from studies.participation import arrive as arrival

    participant, _ = arrival.arrive(study, prolific(pid=PID))
    [(scope, key, _)] = ratelimit.message_limits(participant.token, None)
    assert scope == "message" and str(participant.token) not in key and len(key) == 16
    assert key == ratelimit.message_limits(participant.token, None)[0][1]  # stable
    other, _ = arrival.arrive(study, prolific(pid="anotherPID", session_id="s2"))
    assert ratelimit.message_limits(other.token, None)[0][1] != key


@pytest.mark.parametrize(
    ("client", "kept"),
    [
        ("203.0.113.77:51234", "203.0.113.0/24"),
        ("2001:db8:abcd:12:1:2:3:4:8080", "2001:db8:abcd::/48"),
        ("::1:443", "::/48"),
        ("", "-"),  # no client (a Unix socket)
    ],
)
def test_the_access_line_keeps_the_clients_network_alone(client, kept):
    """uvicorn's access line starts with the participant's address and port: the address is
    personal data, and the line keeps only its network, whatever handler writes it."""
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        (client, "GET", "/p/1/", "1.1", 200),
        None,
    )  # uvicorn's own call, argument for argument
    server_log.RedactParticipants().filter(record)
    assert record.getMessage() == f'{kept} - "GET /p/[token]/ HTTP/1.1" 200'
