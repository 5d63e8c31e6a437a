"""LLMClient against several replicas of one endpoint (real HTTP servers): a conversation keeps
to one replica, fails over when it is down, and is never retried once text has streamed."""

import pytest

from agents.llm import LLMClient, LLMConnectionError, replicas
from tests.support.engine import MESSAGES, closed_port, drain, sse, text_chunks
from tests.support.scripted_server import ScriptedServer

pytestmark = pytest.mark.asyncio


@pytest.fixture(autouse=True)
def fresh_memory():
    """Each test starts with no replica remembered as down (the memory is the process's)."""
    replicas._down_until.clear()
    yield
    replicas._down_until.clear()


def script(n=40):
    return ScriptedServer([{"content": f"Answer {i}."} for i in range(n)])


async def test_a_conversation_keeps_to_one_replica_and_conversations_spread():
    with script() as a, script() as b:
        async with LLMClient([a.url, b.url], max_retries=0) as client:
            homes = {}
            for key in [f"participant-{i}" for i in range(12)]:
                served = set()
                for _ in range(3):
                    stream = client.stream_chat("m", MESSAGES, conversation=key)
                    await drain(stream)
                    served.add(stream.result.replica)
                assert len(served) == 1, f"{key} moved between replicas: {served}"
                homes[key] = served.pop()
    assert set(homes.values()) == {a.url, b.url}  # 12 conversations over both
    assert len(a.requests) + len(b.requests) == 36


async def test_the_next_turn_fails_over_when_its_replica_is_down_and_names_the_other():
    with script() as a, script() as b:
        servers = {a.url: a, b.url: b}
        async with LLMClient([a.url, b.url], max_retries=2, backoff=5.0) as client:
            stream = client.stream_chat("m", MESSAGES, conversation="p1")
            await drain(stream)
            home = stream.result.replica
            other = b.url if home == a.url else a.url
            servers[home].__exit__(None, None, None)  # the home replica stops

            stream = client.stream_chat("m", MESSAGES, conversation="p1")
            assert await drain(stream)
            result = stream.result
            # served by the other replica on the second attempt, with no backoff before it
            assert result.replica == other and result.attempts == 2
            assert result.latency < 5.0 and result.ttft is not None
            # once a connection to it has been refused the dead replica is remembered as down
            # (a dropped pooled connection alone does not count) and turns go to the other at once
            stream = client.stream_chat("m", MESSAGES, conversation="p1")
            await drain(stream)
            assert stream.result.replica == other and replicas.seen_down(home)
            stream = client.stream_chat("m", MESSAGES, conversation="p1")
            await drain(stream)
            assert stream.result.replica == other and stream.result.attempts == 1
            # a whole (non-streamed) reply fails over the same way
            reply = await client.chat("m", MESSAGES, conversation="p1")
            assert reply.replica == other


async def test_replicas_the_caller_knows_to_be_down_are_tried_last():
    with script() as a, script() as b:
        async with LLMClient([a.url, b.url], max_retries=0) as client:
            for key in ("k1", "k2", "k3", "k4"):
                stream = client.stream_chat("m", MESSAGES, conversation=key, avoid={a.url})
                await drain(stream)
                assert stream.result.replica == b.url
    assert a.requests == []


async def test_with_every_replica_down_the_call_fails_after_trying_each():
    dead = [f"http://127.0.0.1:{closed_port()}/v1" for _ in range(2)]
    async with LLMClient(dead, max_retries=1, backoff=0.01) as client:
        with pytest.raises(LLMConnectionError) as info:
            await drain(client.stream_chat("m", MESSAGES, conversation="p1"))
    assert info.value.attempts == 2
    assert all(replicas.seen_down(url) for url in dead)


async def test_no_retry_on_another_replica_once_text_has_streamed(peer):
    # both replicas would drop after "Hel": whichever serves, the caller gets one attempt only
    first, url_a = await peer(sse(text_chunks("Hel", "lo")[:2], done=False))
    second, url_b = await peer(sse(text_chunks("Hel", "lo")[:2], done=False))
    async with LLMClient([url_a, url_b], max_retries=3, backoff=0.01) as client:
        pieces = []
        with pytest.raises(LLMConnectionError) as info:
            async for piece in client.stream_chat("m", MESSAGES, conversation="p1"):
                pieces.append(piece)
    assert pieces == ["Hel"] and info.value.partial == "Hel" and info.value.attempts == 1
    assert len(first.requests) + len(second.requests) == 1
