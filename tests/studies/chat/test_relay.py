"""The relay of one reply to the page, against streams whose timing the test sets: the "slow"
notice before the first token and before the first delta, a stall after the first token, a
reply of tool calls only (no text) that still gets its notice, and a turn cancelled from
outside that stays cancelled rather than becoming a stall."""

import asyncio
import time

import pytest

from studies.chat.agent_turn import EngineStalled, relay

STALL = 0.2


class Stream:
    """Pieces after the given pauses; a piece of None is a token that shows no text (a tool
    call's), which is progress all the same."""

    def __init__(self, timeline: list[tuple[float, str | None]]):
        self.timeline = timeline
        self.last_token = None

    async def __aiter__(self):
        for pause, piece in self.timeline:
            await asyncio.sleep(pause)
            self.last_token = time.monotonic()
            if piece is not None:
                yield piece


async def relayed(timeline, slow_send: float = 0.0) -> list[dict]:
    sent = []

    async def send(message):
        if message["type"] == "slow":
            await asyncio.sleep(slow_send)  # a page slow to take the notice
        sent.append(message)

    try:
        await relay(Stream(timeline), send, "m1")
    except EngineStalled as error:
        sent.append({"type": "stalled", "why": str(error)})
    return sent


@pytest.fixture(autouse=True)
def timeouts(settings):
    settings.PARLEY_STALL_TIMEOUT = STALL
    settings.PARLEY_FIRST_TOKEN_TIMEOUT = 4 * STALL


async def test_a_slow_start_is_told_once_before_the_first_delta():
    sent = await relayed([(2 * STALL, "Hello"), (0.01, " there")])
    assert [m["type"] for m in sent][:2] == ["slow", "delta"]
    assert [m["type"] for m in sent].count("slow") == 1
    assert "".join(m["text"] for m in sent if m["type"] == "delta") == "Hello there"


async def test_a_steady_stream_hears_no_notice():
    sent = await relayed([(STALL / 2, "a")] + [(STALL / 2, " b")] * 6)
    assert {m["type"] for m in sent} == {"delta"}
    assert "".join(m["text"] for m in sent) == "a" + " b" * 6


async def test_silence_after_the_first_token_is_a_stall():
    sent = await relayed([(0.01, "Hi"), (3 * STALL, " late")])
    assert sent[-1]["type"] == "stalled" and f"for {STALL:g} s" in sent[-1]["why"]
    assert "".join(m.get("text", "") for m in sent) == "Hi"


async def test_no_first_token_within_the_first_token_timeout_is_a_stall():
    sent = await relayed([(6 * STALL, "never")])
    assert [m["type"] for m in sent] == ["slow", "stalled"]
    assert "no first token" in sent[-1]["why"]


async def test_tokens_without_text_keep_the_turn_alive_and_a_late_notice_still_goes():
    # a tool call streams tokens but no text: no stall, and the "slow" notice is not lost
    sent = await relayed([(1.5 * STALL, None)] + [(STALL / 2, None)] * 4)
    assert [m["type"] for m in sent] == ["slow"]
    # the reply ends while the notice is still on its way: it goes all the same
    sent = await relayed([(1.5 * STALL, None)], slow_send=STALL)
    assert [m["type"] for m in sent] == ["slow"]


async def test_a_turn_cancelled_from_outside_stays_cancelled():
    sent = []

    async def send(message):
        sent.append(message)

    task = asyncio.ensure_future(relay(Stream([(0.01, "Hi"), (10, "never")]), send, "m1"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(2 * STALL)  # its timer was stopped: nothing more is sent
    assert [m["type"] for m in sent] == ["delta"]
