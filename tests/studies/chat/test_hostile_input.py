"""Hostile input, fuzzed and by hand: WebSocket frames against the real consumer, and every
participant form. Each gets an error event, a proper close code or a form error; never a crash
(1006/1011, a traceback, a 500) and never a stored message that locks the participant out."""

import json
import urllib.parse
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from studies.chat.routing import websocket_urlpatterns
from studies.models import Message, Participant, Response, StudyError
from studies.participation import arrive as arrival
from studies.participation import ratelimit
from studies.participation.chat_turn import storable_text
from studies.participation.consent import give_consent
from tests.support.faulty_engine import FaultyEngine
from tests.support.processes import need_service
from tests.support.studies import GOOD_ANSWERS, make_study, prolific

app = URLRouter(websocket_urlpatterns)
PROPER_CLOSES = {1000, 1003, 1007, 1008, 1009} | set(range(4000, 5000))
SCRIPT = "<script>alert(1)</script>"
NASTY = ["\x00", "\ud800", "\udfff", "\ud83d", "\u202e", SCRIPT, '"', "\\", "{", "[", "\n"]
fuzzed = hypothesis_settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

# --- strategies ---------------------------------------------------------------------------------

hostile_text = st.lists(st.one_of(st.characters(), st.sampled_from(NASTY)), max_size=12).map(
    "".join
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), hostile_text
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=8,
)
client_ids = st.one_of(st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True), hostile_text)
messages = st.fixed_dictionaries(
    {"type": st.just("message"), "id": client_ids, "text": st.one_of(hostile_text, json_values)}
)
typed = st.fixed_dictionaries(
    {"type": st.one_of(st.sampled_from(["end", "message", "", "history"]), json_values)},
    optional={"id": client_ids, "text": json_values},
)
SPECIAL = [
    "",
    " ",
    "null",
    "[]",
    "1e999",
    "NaN",
    "[" * 5000,
    '{"a":' * 3000,
    "x" * 70_000,
    json.dumps({"type": "message", "id": "big", "text": "y" * 70_000}),
    '{"type": "message", "id": "nul", "text": "\\u0000"}',
    '{"type": "message", "id": "lone", "text": "a\\ud800b"}',
    json.dumps({"type": "message", "id": "html", "text": SCRIPT}),
]
frames = st.one_of(
    st.binary(max_size=64),
    hostile_text,
    st.sampled_from(SPECIAL),
    st.one_of(messages, typed, json_values).flatmap(
        lambda value: st.sampled_from(
            [json.dumps(value), json.dumps(value, ensure_ascii=False)]  # escaped and raw
        )
    ),
)

# --- the socket ---------------------------------------------------------------------------------


@pytest.fixture
def engine():
    with FaultyEngine() as running:
        yield running


def chatting(engine_url, pid, **fields):
    study = make_study(slug=f"h-{pid}", engine=engine_url, **fields)
    participant, _ = arrival.arrive(study, prolific(pid=pid))
    return give_consent(participant, True)


async def open_window(participant, client=None):
    window = WebsocketCommunicator(app, f"/ws/p/{participant.token}/")
    if client:
        window.scope["client"] = client
    connected, code = await window.connect(timeout=10)
    assert connected, code
    assert (await window.receive_json_from(timeout=10))["type"] == "history"
    return window


async def outcome(window) -> list[dict]:
    """The events a frame brought, up to its last one (status, error, redirect) or the close."""
    events = []
    while True:
        output = await window.receive_output(timeout=10)  # re-raises a crash of the consumer
        if output["type"] == "websocket.close":
            code = output.get("code", 1000)
            assert code in PROPER_CLOSES, f"abnormal close {code} after {events}"
            return [*events, {"type": "close", "code": code}]
        event = json.loads(output["text"])
        events.append(event)
        if event["type"] == "error" and event.get("reply_to"):
            # a refused message must not come back on every reconnect
            assert event.get("drop") or event.get("retry"), event
        if event["type"] in ("status", "error", "redirect"):
            return events


async def send_frame(participant, frame) -> list[dict]:
    window = await open_window(participant)
    # the raw ASGI frame: the communicator's send_to refuses empty frames, a browser does not
    key = "bytes" if isinstance(frame, bytes) else "text"
    await window.send_input({"type": "websocket.receive", key: frame})
    events = await outcome(window)
    # As the server does after any close, ours or the client's: the consumer leaves its group
    # and ends in this event loop. One left running would be sent the next window's
    # "superseded" notice, and the Redis layer's clean-up of that receive would be cut off
    # when this loop closes, leaving the layer's lock held for the next loop (a random hang).
    await window.disconnect()
    return events


@database_sync_to_async
def stored_texts(participant):
    return list(
        Message.objects.filter(conversation__participant=participant, role="user").values_list(
            "content", flat=True
        )
    )


async def still_chats(participant):
    """The participant is not locked out: a plain message is stored and answered."""
    window = await open_window(participant)
    await window.send_json_to({"type": "message", "id": f"ok-{uuid.uuid4().hex}", "text": "Hi"})
    kinds = [event["type"] for event in await outcome(window)]
    assert kinds[0] == "ack" and "reply" in kinds and kinds[-1] == "status", kinds
    await window.disconnect()


@pytest.mark.django_db(transaction=True)
def test_fuzzed_frames_never_crash_the_socket_or_lock_the_participant_out(engine, settings):
    settings.PARLEY_RATE_MESSAGES_PER_PARTICIPANT = 0  # the fuzzer sends far beyond any limit
    participant = chatting(engine.url, "fuzz", min_exchanges=30000, max_exchanges=30000)

    @fuzzed
    @given(frame=frames)
    def check(frame):
        async_to_sync(send_frame)(participant, frame)

    check()
    texts = async_to_sync(stored_texts)(participant)
    assert all(text == storable_text(text) for text in texts)
    async_to_sync(still_chats)(participant)


CASES = [
    (b"\x00\xff binary", {"type": "close", "code": 1003}),
    (b"", {"type": "close", "code": 1003}),
    ("x" * 70_000, {"type": "close", "code": 1009}),
    ("not json", "not valid JSON"),
    ("", "not valid JSON"),
    ("[" * 5000, "not valid JSON"),
    ("[1, 2]", "Unknown message type"),
    ('{"type": {"nested": [[[]]]}}', "Unknown message type"),
    ('{"type": "message", "id": "a\\u0000b", "text": "hi"}', "needs an id"),
    ('{"type": "message", "id": "abc\\n", "text": "hi"}', "needs an id"),  # `$` took it
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("frame, expected", CASES)
def test_each_kind_of_bad_frame_gets_its_answer(engine, frame, expected):
    participant = chatting(engine.url, "bad")
    events = async_to_sync(send_frame)(participant, frame)
    if isinstance(expected, dict):
        assert events == [expected]
    else:
        assert events[-1]["type"] == "error" and expected in events[-1]["message"], events
    assert async_to_sync(stored_texts)(participant) == []
    async_to_sync(still_chats)(participant)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "text, kept",
    [
        ("a\x00b", "ab"),  # PostgreSQL refuses NUL in text: stripped
        ("a\ud800b", "a\ufffdb"),  # a lone surrogate is not UTF-8: replaced
        (SCRIPT, SCRIPT),  # stored as written; chat.js shows it as text
    ],
)
def test_unstorable_characters_are_cleaned_and_a_resend_is_harmless(engine, text, kept):
    participant = chatting(engine.url, "clean")

    async def scenario():
        for attempt in range(2):  # chat.js resends an unacknowledged id after a reconnect
            window = await open_window(participant)
            await window.send_json_to({"type": "message", "id": "odd", "text": text})
            events = await outcome(window)
            assert events[0] == {"type": "ack", "id": "odd", "seq": 1, "duplicate": attempt == 1}
            assert "reply" in [e["type"] for e in events]
            await window.disconnect()

    async_to_sync(scenario)()
    assert async_to_sync(stored_texts)(participant) == [kept]


@pytest.mark.django_db(transaction=True)
def test_a_message_that_cleans_to_nothing_is_refused_for_good(engine):
    participant = chatting(engine.url, "empty")
    events = async_to_sync(send_frame)(
        participant, json.dumps({"type": "message", "id": "nul", "text": "\x00\x00"})
    )
    assert events[-1]["type"] == "error" and events[-1]["drop"] is True
    assert events[-1]["reply_to"] == "nul"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "path", ["/ws/p/garbage/", "/ws/p/", "/ws/p/%00/", "/ws/anything/else/", "/"]
)
async def test_malformed_socket_addresses_close_cleanly(path):
    window = WebsocketCommunicator(app, path)
    connected, code = await window.connect(timeout=10)
    assert not connected and code == 4404


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "origin, opens",
    [
        ("https://study.example.org", True),
        ("https://study.example.org:443", True),
        ("https://STUDY.example.org", True),
        ("http://study.example.org", False),  # the site's host, another scheme
        ("https://study.example.org:8443", False),  # ... another port
        ("https://evil.example", False),
        ("null", False),
        (None, False),  # no Origin: refused where the hosts are named
    ],
)
async def test_only_the_sites_own_pages_open_a_chat_socket(settings, origin, opens):
    from parley.asgi import application

    settings.ALLOWED_HOSTS = ["study.example.org"]
    settings.PUBLIC_URL = "https://study.example.org"
    participant = await database_sync_to_async(chatting)("http://127.0.0.1:9/v1", "origin")
    headers = [(b"host", b"study.example.org")]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    window = WebsocketCommunicator(application, f"/ws/p/{participant.token}/", headers=headers)
    window.scope["scheme"] = "wss"  # behind the TLS proxy (uvicorn --proxy-headers)
    connected, _ = await window.connect(timeout=10)
    assert connected is opens
    await window.disconnect()


# --- rate limits on messages (a window opens at its first event: no minute boundary to cross) ---


@pytest.mark.django_db(transaction=True)
def test_messages_over_the_participants_limit_are_told_to_slow_down(engine, settings):
    settings.PARLEY_RATE_MESSAGES_PER_PARTICIPANT = 2
    participant = chatting(engine.url, "rate")

    async def scenario():
        window = await open_window(participant)
        answers = []
        for n in range(3):
            await window.send_json_to({"type": "message", "id": f"r{n}", "text": f"Hi {n}"})
            answers.append(await outcome(window))
        await window.disconnect()
        return answers

    first, second, third = async_to_sync(scenario)()
    assert first[0]["type"] == second[0]["type"] == "ack"
    assert third == [
        {
            "type": "error",
            "reply_to": "r2",
            "retry": True,
            "message": third[0]["message"],
        }
    ]
    assert "slow down" in third[0]["message"]
    assert async_to_sync(stored_texts)(participant) == ["Hi 0", "Hi 1"]


@pytest.mark.django_db(transaction=True)
def test_messages_over_the_ip_limit_are_told_to_slow_down(engine, settings):
    settings.PARLEY_RATE_MESSAGES_PER_IP = 3
    ip = f"198.51.100.1-{uuid.uuid4().hex[:8]}"  # unique per run, as the cache may be shared
    one, two = chatting(engine.url, "ip1"), chatting(engine.url, "ip2")

    async def scenario():
        kinds = []
        for n, participant in enumerate([one, two, one, two]):
            window = await open_window(participant, client=[ip, 40000 + n])
            await window.send_json_to({"type": "message", "id": f"i{n}", "text": "Hi"})
            kinds.append((await outcome(window))[0]["type"])
            await window.disconnect()
        return kinds

    assert async_to_sync(scenario)() == ["ack", "ack", "ack", "error"]


@pytest.mark.asyncio
async def test_the_sockets_limiter_counts_with_the_views_and_lets_through_with_redis_away(
    settings, redis_url
):
    """The consumer's asyncio client counts in the same buckets as the sync limiter; an
    unreachable Redis lets the message through rather than locking the participant out."""
    settings.PARLEY_RATE_MESSAGES_PER_PARTICIPANT = 2
    need_service(ratelimit.async_limiter() is not None, "needs the cache on Redis (REDIS_URL)")
    token = uuid.uuid4().hex
    assert ratelimit.message_allowed(token, "127.0.0.1")
    assert await ratelimit.message_allowed_async(token, "127.0.0.1")
    assert not await ratelimit.message_allowed_async(token, "127.0.0.1")
    assert not ratelimit.message_allowed(token, "127.0.0.1")

    # Nothing listens on port 1: the connection is refused.
    settings.CACHES = {
        "default": {**settings.CACHES["default"], "LOCATION": "redis://127.0.0.1:1/0"}
    }
    assert await ratelimit.message_allowed_async(token, "127.0.0.1")


# --- the forms ----------------------------------------------------------------------------------

form_values = st.one_of(hostile_text, st.sampled_from(["", "2", "1.5", "1e999", "nan", SCRIPT]))


def post_raw(client, url, data: dict):
    """A form POST whose body may carry what a browser would send for broken text (CESU bytes)."""
    body = urllib.parse.urlencode(data, encoding="utf-8", errors="surrogatepass")
    return client.post(url, body, content_type="application/x-www-form-urlencoded")


def at_questionnaire(study, pid):
    participant, _ = arrival.arrive(study, prolific(pid=pid))
    give_consent(participant, True)
    Participant.objects.filter(pk=participant.pk).update(status=Participant.Status.QUESTIONNAIRE)
    return participant


@pytest.mark.django_db
def test_fuzzed_questionnaire_answers_are_form_errors_or_stored_never_a_500(client, study):
    participant = at_questionnaire(study, "fuzzq")
    url = f"/p/{participant.token}/questionnaire/"

    @fuzzed
    @given(answers=st.fixed_dictionaries({}, optional={k: form_values for k in GOOD_ANSWERS}))
    def check(answers):
        Participant.objects.filter(pk=participant.pk).update(
            status=Participant.Status.QUESTIONNAIRE
        )
        Response.objects.filter(participant=participant).delete()
        response = post_raw(client, url, {**GOOD_ANSWERS, **answers})
        assert response.status_code in (302, 400)
        assert SCRIPT.encode() not in response.content  # shown back as text, never as markup
        for text in Response.objects.filter(participant=participant).values_list(
            "value_text", flat=True
        ):
            assert text is None or text == storable_text(text)

    check()


@pytest.mark.django_db
@pytest.mark.parametrize("comment", ["fine\x00", "\x00"])
def test_a_nul_in_a_questionnaire_answer_is_a_form_error(client, study, comment):
    """On PostgreSQL (DATABASE_URL) storing it would be a 500; here it never reaches the DB."""
    participant = at_questionnaire(study, "nulq")
    response = client.post(
        f"/p/{participant.token}/questionnaire/", {**GOOD_ANSWERS, "comment": comment}
    )
    assert response.status_code == 400
    assert "unusual characters" in response.content.decode()
    participant.refresh_from_db()
    assert participant.status == Participant.Status.QUESTIONNAIRE
    assert not Response.objects.filter(participant=participant).exists()


@pytest.mark.django_db
def test_fuzzed_consent_decisions_never_fail(client, study):
    @fuzzed
    @given(decision=form_values, extra=st.dictionaries(hostile_text, form_values, max_size=3))
    def check(decision, extra):
        participant, _ = arrival.arrive(study, prolific(pid=f"c{uuid.uuid4().hex[:20]}"))
        url = f"/p/{participant.token}/consent/"
        response = post_raw(client, url, {**extra, "decision": decision})
        # the two buttons decide; anything else is a clear 400 that changes nothing
        expected = 302 if decision in ("accept", "decline") else 400
        assert response.status_code == expected
        participant.refresh_from_db()
        assert (participant.status == Participant.Status.CONSENT) == (expected == 400)

    check()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/p/not-a-uuid/"),
        ("get", "/p/00000000-0000-0000-0000-000000000000/"),
        ("post", "/p/not-a-uuid/consent/"),
        ("post", "/p/00000000-0000-0000-0000-000000000000/questionnaire/"),
        ("get", "/p/%00/done/"),
        ("get", "/p/0000/"),
        ("get", "/p/00000000-0000-0000-0000-00000000000%C3%A9/"),
        ("post", "/p/%20/consent/"),
        ("get", "/s/%C3%A9tude/"),
        ("get", "/s/a%27b/"),
        ("get", "/s/%00/"),
        ("get", "/s/no-such-study/"),
        ("get", "/ws/p/garbage/"),
    ],
)
def test_malformed_participant_urls_are_404(client, study, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 404
    if not path.startswith("/ws/"):  # a page a participant could open: the friendly one
        assert "studies/problem.html" in [t.name for t in response.templates]
        assert b"please message the researchers" in response.content
        assert not StudyError.objects.exists()  # no study to keep it under


# --- rate limits on arrivals --------------------------------------------------------------------


@pytest.mark.django_db
def test_arrivals_over_the_ip_limit_get_a_429_page(client, study, settings):
    settings.PARLEY_RATE_ARRIVALS_PER_IP = 3
    # unique per run: the cache may be a Redis that other runs share
    ip, other = (f"203.0.113.{n}-{uuid.uuid4().hex[:8]}" for n in (1, 2))

    def arrive(pid, address):
        return client.get("/s/s1/", prolific(pid=pid), REMOTE_ADDR=address)

    assert [arrive(f"a{n}", ip).status_code for n in range(3)] == [302, 302, 302]
    refused = arrive("a3", ip)
    assert refused.status_code == 429 and "Too many requests" in refused.content.decode()
    assert not Participant.objects.filter(prolific_pid="a3").exists()
    assert arrive("a4", other).status_code == 302  # the limit is per address
    assert [arrive(f"l{n}", "127.0.0.1").status_code for n in range(5)] == [302] * 5  # exempt
