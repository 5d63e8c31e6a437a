"""LLMClient against the real embedded engine."""

import pytest

from agents.llm import LLMClient, LLMHTTPError
from tests.support.engine import (
    give_up_on_a_forced_call,
)

pytestmark = pytest.mark.model

MESSAGES = [
    {"role": "system", "content": "You are a friendly assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


async def test_stream_and_whole_reply_agree(served):
    async with LLMClient(served.url) as client:
        stream = client.stream_chat(served.base, MESSAGES, temperature=0, max_tokens=10)
        pieces = [piece async for piece in stream]
        result = stream.result
        whole = await client.chat(served.base, MESSAGES, temperature=0, max_tokens=10)
    assert len(pieces) > 1, "the reply did not stream piece by piece"
    assert "".join(pieces) == result.content == whole.content
    assert result.usage["completion_tokens"] == whole.usage["completion_tokens"] <= 10
    assert result.finish_reason in ("stop", "length") and result.model == served.base
    assert 0 < result.ttft <= result.latency
    assert result.attempts == 1 and result.tool_calls == []
    assert whole.ttft == whole.latency > 0


async def test_list_models(served):
    async with LLMClient(served.url) as client:
        models = await client.list_models()
    assert models[0] == served.base and "tiny-lora" in models


async def test_bad_request_is_not_retried(served):
    async with LLMClient(served.url, max_retries=3, backoff=0.01) as client:
        with pytest.raises(LLMHTTPError) as info:
            await client.chat(served.base, MESSAGES, temperature=9)
    assert info.value.status == 400 and info.value.attempts == 1
    assert "temperature" in str(info.value)


async def test_unknown_model(served):
    async with LLMClient(served.url, max_retries=3, backoff=0.01) as client:
        with pytest.raises(LLMHTTPError) as info:
            await drain(client.stream_chat("nobody", MESSAGES, max_tokens=2))
    assert info.value.status == 404 and info.value.attempts == 1


async def test_breaking_out_early_with_async_with_closes_the_stream(served):
    async with LLMClient(served.url) as client:
        async with client.stream_chat(served.base, MESSAGES, max_tokens=50) as stream:
            async for _ in stream:
                break
        with pytest.raises(RuntimeError, match="not finished"):
            _ = stream.result
        # the engine is free again for the next call
        reply = await client.chat(served.base, MESSAGES, max_tokens=1)
    assert reply.usage["completion_tokens"] == 1


async def drain(stream):
    return [piece async for piece in stream]


async def test_a_reply_given_up_on_mid_call_stops_at_the_engine(served):
    """Issue 23: a stalled reply the chat gave up on went on generating for 106 s beside the
    retry; the client hangs up, and the engine drops a request whose client has gone."""
    await give_up_on_a_forced_call(served.url, served.base)
