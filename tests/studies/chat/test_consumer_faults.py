"""The chat survives its engine's faults and a second window: a stall gives a notice in seconds
and Retry, frames sent meanwhile are answered, an engine that dies mid-reply gives an error
at once, and two windows answering one message store one reply."""

import asyncio
import time

import pytest
from channels.db import database_sync_to_async
from django.conf import settings as django_settings

from studies.chat import agent_turn
from studies.models import Message, ToolChoice
from tests.support.faulty_engine import REPLY, FaultyEngine
from tests.support.studies import (
    chatting_participant,
    connect,
    forced,
    participant_in,
    receive_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
STALL = 1.0  # the tests' stall timeout; the default is checked on its own


@database_sync_to_async
def stored(participant):
    """(role, the client id it is or answers, content) of every stored message, in order."""
    messages = Message.objects.filter(conversation__participant=participant)
    return [
        (m.role, m.reply_to.client_id if m.reply_to_id else m.client_id, m.content)
        for m in messages.select_related("reply_to").order_by("seq")
    ]


async def test_the_default_stall_timeout_gives_a_notice_within_10_s():
    stall, first = agent_turn.stall_timeout(), agent_turn.first_token_timeout()
    assert stall < 10 and stall <= first < django_settings.PARLEY_LLM_TIMEOUT


async def test_a_stalled_engine_gives_a_notice_and_retry_answers(settings, sockets):
    settings.PARLEY_STALL_TIMEOUT = STALL
    with FaultyEngine(["stall", "ok"]) as engine:
        participant = await chatting_participant(engine.url, pid="stall1")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        sent = time.monotonic()
        await window.send_json_to({"type": "message", "id": "s1", "text": "Hello?"})
        events = await receive_until(window, "error", timeout=10)
        assert time.monotonic() - sent < STALL + 3
        notice = events[-1]
        assert notice["stalled"] and notice["retry"] and notice["reply_to"] == "s1"
        assert [e["type"] for e in events[:3]] == ["ack", "start", "delta"]
        await receive_until(window, "status")

        await window.send_json_to({"type": "message", "id": "s1", "text": "Hello?"})  # Retry
        events = await receive_until(window, "reply", timeout=10)
        assert events[0]["duplicate"] is True
        assert events[-1]["message"]["content"].strip() == REPLY
        assert await stored(participant) == [
            ("user", "s1", "Hello?"),
            ("assistant", "s1", REPLY),
        ]
        await window.disconnect()


async def hung_up(engine, within: float) -> bool:
    """Whether every reply the engine was streaming has lost its client within `within` s."""
    deadline = time.monotonic() + within
    while engine.open_streams and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return engine.open_streams == 0


@pytest.mark.parametrize("fault", ["mute", "stall"])  # before the first token, and after it
async def test_a_stalled_reply_is_hung_up_so_the_engine_stops_generating_it(
    fault, settings, sockets
):
    """Issue 23: a stalled request the chat gave up on went on at the engine beside the retry.
    The client closes its stream, which is what makes an engine abort the request."""
    settings.PARLEY_STALL_TIMEOUT = settings.PARLEY_FIRST_TOKEN_TIMEOUT = STALL
    with FaultyEngine([fault, "ok"]) as engine:
        participant = await chatting_participant(engine.url, pid=f"hangup-{fault}")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        await window.send_json_to({"type": "message", "id": "h1", "text": "Hello?"})
        events = await receive_until(window, "error", timeout=10)
        assert events[-1]["stalled"]
        assert await hung_up(engine, within=2.0), "the stalled reply's stream was left open"
        await receive_until(window, "status")
        await window.send_json_to({"type": "message", "id": "h1", "text": "Hello?"})  # Retry
        events = await receive_until(window, "reply", timeout=10)
        assert events[-1]["message"]["content"].strip() == REPLY
        await window.disconnect()


async def test_a_retry_after_a_stall_sends_the_first_trys_request(settings, sockets):
    """Issue 23: a Retry after a stall on an airline arm asks for the same tool use as the
    first try: the same tools, the same forced call (structured format, tool choice "first")
    and the same conversation."""
    settings.PARLEY_STALL_TIMEOUT = settings.PARLEY_FIRST_TOKEN_TIMEOUT = STALL
    with FaultyEngine(["mute", "ok"]) as engine:
        participant = await participant_in(
            engine.url, "airline", tool_format="structured", tool_choice=ToolChoice.FIRST
        )
        window = await connect(sockets, participant)
        await window.receive_json_from()
        await window.send_json_to({"type": "message", "id": "r1", "text": "Change my flight."})
        assert (await receive_until(window, "error", timeout=10))[-1]["stalled"]
        await receive_until(window, "status")
        await window.send_json_to({"type": "message", "id": "r1", "text": "Change my flight."})
        await receive_until(window, "reply", timeout=10)
        await window.disconnect()
    first, retry = engine.requests[:2]
    assert forced(first) and first["response_format"]["format"]["tags"]
    assert retry == first


async def test_frames_sent_during_a_stall_are_answered_and_end_always_is(settings, sockets):
    settings.PARLEY_STALL_TIMEOUT = STALL
    with FaultyEngine(["stall", "stall"]) as engine:
        participant = await chatting_participant(engine.url, pid="stall2")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        await window.send_json_to({"type": "message", "id": "a", "text": "First"})
        await receive_until(window, "delta", timeout=10)  # the reply has begun, then stalls
        await window.send_json_to({"type": "dance"})
        await window.send_json_to({"type": "message", "id": "b", "text": "Still there?"})
        await window.send_json_to({"type": "end"})
        events = await receive_until(window, "redirect", timeout=4 * STALL + 10)
        kinds = [e["type"] for e in events]
        stalls = [e["reply_to"] for e in events if e.get("stalled")]
        assert stalls == ["a", "b"], kinds
        assert any(e["type"] == "error" and "Unknown" in e["message"] for e in events)
        assert any(e["type"] == "ack" and e["id"] == "b" for e in events)
        assert [(r, c) for r, c, _ in await stored(participant)] == [("user", "a"), ("user", "b")]
        await window.disconnect()


async def test_an_engine_slow_to_start_is_announced_then_answers(settings, sockets):
    settings.PARLEY_STALL_TIMEOUT = 0.5
    with FaultyEngine(["late"], pace=1.5) as engine:
        participant = await chatting_participant(engine.url, pid="late1")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        await window.send_json_to({"type": "message", "id": "l1", "text": "Hello?"})
        events = await receive_until(window, "reply", timeout=10)
        assert [e["type"] for e in events[:3]] == ["ack", "start", "slow"]
        assert "error" not in [e["type"] for e in events]
        await window.disconnect()


async def test_an_engine_that_never_starts_is_a_stall_after_the_first_token_timeout(
    settings, sockets
):
    settings.PARLEY_STALL_TIMEOUT, settings.PARLEY_FIRST_TOKEN_TIMEOUT = 0.5, 1.5
    with FaultyEngine(["mute"]) as engine:
        participant = await chatting_participant(engine.url, pid="mute1")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        sent = time.monotonic()
        await window.send_json_to({"type": "message", "id": "q1", "text": "Hello?"})
        events = await receive_until(window, "error", timeout=10)
        assert 1.5 <= time.monotonic() - sent < 5
        assert [e["type"] for e in events] == ["ack", "start", "slow", "error"]
        assert events[-1]["stalled"] and events[-1]["retry"]
        await window.disconnect()


async def test_an_engine_dying_mid_reply_gives_an_error_at_once_and_retry_answers(sockets):
    with FaultyEngine(["die", "ok"]) as engine:
        participant = await chatting_participant(engine.url, pid="die1")
        window = await connect(sockets, participant)
        await window.receive_json_from()
        sent = time.monotonic()
        await window.send_json_to({"type": "message", "id": "d1", "text": "Hi"})
        events = await receive_until(window, "error", timeout=10)
        assert time.monotonic() - sent < 2
        assert events[-1]["retry"] and not events[-1].get("stalled")
        await receive_until(window, "status")
        assert [r for r, _, _ in await stored(participant)] == ["user"]

        await window.send_json_to({"type": "message", "id": "d1", "text": "Hi"})
        events = await receive_until(window, "reply", timeout=10)
        assert [r for r, _, _ in await stored(participant)] == ["user", "assistant"]
        await window.disconnect()


async def test_a_second_window_mid_reply_stores_one_reply_not_two(sockets):
    with FaultyEngine(["slow", "slow"], pace=0.15) as engine:
        participant = await chatting_participant(engine.url, pid="two1")
        first = await connect(sockets, participant)
        await first.receive_json_from()
        await first.send_json_to({"type": "message", "id": "w1", "text": "Hello"})
        await receive_until(first, "delta", timeout=10)  # the first window's reply is streaming
        second = await connect(sockets, participant)  # answers the pending message on connect
        history = await second.receive_json_from()
        assert [m["client_id"] for m in history["messages"]] == ["w1"]

        first_reply = (await receive_until(first, "reply", timeout=20))[-1]["message"]
        second_reply = (await receive_until(second, "reply", timeout=20))[-1]["message"]
        assert len(engine.requests) == 2  # both windows did ask the engine ...
        assert first_reply == second_reply  # ... and both show the one stored reply
        assert [(r, c) for r, c, _ in await stored(participant)] == [
            ("user", "w1"),
            ("assistant", "w1"),
        ]
        await second.disconnect()
        await first.disconnect()
