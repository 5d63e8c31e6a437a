"""LLMClient against the real embedded engine."""

import asyncio
import time

import pytest

from agents.llm import LLMClient, LLMHTTPError
from tests.conftest import engine_metric

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


# A tool whose forced calls SmolLM2 repeats until its budget runs out: a long reply that is all
# tool calls, which the client reads whole before it hands the caller anything.
LOOKUP = {
    "type": "function",
    "function": {
        "name": "find_order",
        "description": "Find an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}


async def until(condition, within: float) -> bool:
    """Whether `condition()` came true within `within` seconds (checked every 50 ms)."""
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return condition()


def running(url: str) -> float:
    return engine_metric(url, "vllm:num_requests_running")


async def give_up_on_a_forced_call(url: str, model: str) -> None:
    """Start a long streamed reply of forced tool calls, give up on it while its calls stream
    (as the chat does on a stall: the reading task is cancelled) and check that the engine
    stops generating it within two seconds (vLLM's running gauge, the embedded engine's too)."""
    async with LLMClient(url, tool_format="structured", timeout=300) as client:
        messages = [{"role": "user", "content": "Find my orders #W1, #W2 and #W3."}]
        async with client.stream_chat(
            model,
            messages,
            tools=[LOOKUP],
            tool_choice="required",
            parallel_tool_calls=True,
            max_tokens=1000,
            temperature=0,
        ) as stream:
            reading = asyncio.ensure_future(anext(aiter(stream), None))
            assert await until(lambda: stream.last_token is not None, within=240)
            assert await asyncio.to_thread(running, url) == 1
            assert not reading.done(), "the reply ended before the test could give up on it"
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            deadline = time.monotonic() + 2.0
            while await asyncio.to_thread(running, url) != 0:
                assert time.monotonic() < deadline, (
                    "the engine went on generating a reply its client gave up on"
                )
                await asyncio.sleep(0.1)


async def test_a_reply_given_up_on_mid_call_stops_at_the_engine(served):
    """Issue 23: a stalled reply the chat gave up on went on generating for 106 s beside the
    retry; the client hangs up, and the engine drops a request whose client has gone."""
    await give_up_on_a_forced_call(served.url, served.base)
