"""LLMClient against small real TCP peers that misbehave on cue: refused connections, late
starts, 5xx/429, dropped streams, silence, and OpenAI-shaped tool-call deltas (which the
embedded engine never emits)."""

import asyncio
import json
import socket
import time

import pytest

from agents.llm import (
    LLMClient,
    LLMConnectionError,
    LLMError,
    LLMHTTPError,
    LLMTimeout,
    shared_client,
)
from agents.llm import client as client_module
from agents.llm.tool_format import tool_call_response_format
from tests.support.engine import MESSAGES, chunk, closed_port, drain, sse, text_chunks
from tests.support.scripted_server import ScriptedServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look an order up.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


def answer(status: int, body: dict, headers: dict | None = None):
    async def reply(reader, writer):
        payload = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    return reply


async def silent(reader, writer):
    await reader.read()  # say nothing until the client hangs up


async def test_refused_connection_is_retried_then_raises():
    async with LLMClient(
        f"http://127.0.0.1:{closed_port()}/v1", max_retries=2, backoff=0.1
    ) as client:
        started = time.monotonic()
        with pytest.raises(LLMConnectionError) as info:
            await drain(client.stream_chat("m", MESSAGES))
        assert info.value.attempts == 3
        assert time.monotonic() - started >= 0.1 + 0.2  # backoff doubles
        with pytest.raises(LLMConnectionError) as info:
            await client.chat("m", MESSAGES)
        assert info.value.attempts == 3 and info.value.retryable


async def test_retries_reach_a_server_that_starts_late(peer):
    port = closed_port()

    async def start_late():
        await asyncio.sleep(0.3)
        return await peer(sse(text_chunks("Hel", "lo")), port=port)

    late = asyncio.create_task(start_late())
    async with LLMClient(f"http://127.0.0.1:{port}/v1", max_retries=6, backoff=0.1) as client:
        stream = client.stream_chat("m", MESSAGES)
        assert await drain(stream) == ["Hel", "lo"]
    server, _ = await late
    assert stream.result.attempts >= 2
    assert stream.result.content == "Hello"
    assert len(server.requests) == 1


async def test_5xx_and_429_are_retried_before_the_first_token(peer):
    server, url = await peer(
        answer(503, {"error": {"message": "overloaded"}}),
        answer(429, {"error": {"message": "slow down"}}, {"retry-after": "0"}),
        sse(text_chunks("ok")),
    )
    async with LLMClient(url, max_retries=2, backoff=0.05) as client:
        stream = client.stream_chat("m", MESSAGES)
        assert await drain(stream) == ["ok"]
    assert stream.result.attempts == 3 and len(server.requests) == 3


async def test_4xx_is_not_retried(peer):
    server, url = await peer(answer(400, {"error": {"message": "bad temperature"}}))
    async with LLMClient(url, max_retries=3, backoff=0.01) as client:
        with pytest.raises(LLMHTTPError) as info:
            await drain(client.stream_chat("m", MESSAGES))
    assert info.value.status == 400 and not info.value.retryable
    assert info.value.attempts == 1 and len(server.requests) == 1
    assert "bad temperature" in str(info.value)


async def test_a_stream_dropped_after_a_token_is_not_retried(peer):
    server, url = await peer(sse(text_chunks("Hel", "lo")[:2], done=False))
    async with LLMClient(url, max_retries=3, backoff=0.01) as client:
        pieces = []
        with pytest.raises(LLMError) as info:
            async for piece in client.stream_chat("m", MESSAGES):
                pieces.append(piece)
    assert pieces == ["Hel"]  # never duplicated by a retry
    assert info.value.partial == "Hel" and info.value.attempts == 1
    assert len(server.requests) == 1


async def test_a_stream_dropped_before_any_token_is_retried(peer):
    server, url = await peer(sse(text_chunks("Hel")[:1], done=False), sse(text_chunks("Hi")))
    async with LLMClient(url, max_retries=1, backoff=0.01) as client:
        stream = client.stream_chat("m", MESSAGES)
        assert await drain(stream) == ["Hi"]
    assert stream.result.attempts == 2 and len(server.requests) == 2


async def test_retries_stop_once_a_piece_has_reached_the_caller(peer):
    # attempt 1 drops before any text (retried); attempt 2 drops after "Hel" (not retried)
    server, url = await peer(
        sse(text_chunks("Hel")[:1], done=False),
        sse(text_chunks("Hel", "lo")[:2], done=False),
        sse(text_chunks("Hi")),
    )
    async with LLMClient(url, max_retries=3, backoff=0.01) as client:
        pieces = []
        with pytest.raises(LLMConnectionError) as info:
            async for piece in client.stream_chat("m", MESSAGES):
                pieces.append(piece)
    assert pieces == ["Hel"] and info.value.partial == "Hel"
    assert info.value.attempts == 2 and len(server.requests) == 2


async def test_a_tool_call_stream_dropped_before_its_end_is_retried(peer):
    # tool-call deltas are not handed to the caller as text, so nothing was shown yet
    opening = {"index": 0, "id": "c", "type": "function", "function": {"name": "get_order"}}
    server, url = await peer(
        sse([chunk({"role": "assistant"}), chunk({"tool_calls": [opening]})], done=False),
        sse(text_chunks("Hi")),
    )
    async with LLMClient(url, max_retries=1, backoff=0.01) as client:
        stream = client.stream_chat("m", MESSAGES, tools=TOOLS)
        assert await drain(stream) == ["Hi"]
    assert stream.result.attempts == 2 and stream.result.tool_calls == []


async def test_silence_is_a_read_timeout_and_not_retried(peer):
    server, url = await peer(silent)
    async with LLMClient(url, timeout=0.4, max_retries=2, backoff=0.01) as client:
        started = time.monotonic()
        with pytest.raises(LLMTimeout) as info:
            await drain(client.stream_chat("m", MESSAGES))
        assert 0.35 < time.monotonic() - started < 5
        assert info.value.attempts == 1 and not info.value.retryable
        with pytest.raises(LLMTimeout):
            await client.chat("m", MESSAGES)
    assert len(server.requests) == 2
    assert "Timed out waiting" in str(info.value)


async def test_connect_timeout_is_retried():
    # A listening socket whose backlog is full drops new connection attempts: a real peer
    # that never completes the TCP handshake.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    await asyncio.sleep(0.1)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        async with LLMClient(url, connect_timeout=0.2, max_retries=1, backoff=0.01) as client:
            with pytest.raises(LLMTimeout) as info:
                await client.chat("m", MESSAGES)
        assert info.value.retryable and info.value.attempts == 2
        assert "connecting" in str(info.value)
    finally:
        for sock in [listener, *fillers]:
            sock.close()


async def test_stream_ending_early_is_an_error(peer):
    server, url = await peer(sse([chunk({"role": "assistant", "content": ""})], done=False))
    async with LLMClient(url, max_retries=0) as client:
        with pytest.raises(LLMConnectionError, match="ended before"):
            await drain(client.stream_chat("m", MESSAGES))


async def test_native_tool_call_deltas_are_assembled(peer):
    def calls(*deltas):
        return chunk({"tool_calls": list(deltas)})

    def opening(index, call_id, name, arguments):
        function = {"name": name, "arguments": arguments}
        return calls({"index": index, "id": call_id, "type": "function", "function": function})

    server, url = await peer(
        sse(
            [
                chunk({"role": "assistant", "content": None}),
                opening(0, "call_a", "get_order", ""),
                calls({"index": 0, "function": {"arguments": '{"order'}}),
                opening(1, "call_b", "calculate", '{"expr'),
                calls({"index": 0, "function": {"arguments": '_id": "#W1"}'}}),
                calls({"index": 1, "function": {"arguments": 'ession": "2+2"}'}}),
                chunk({}, "tool_calls"),
                chunk(usage={"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}),
            ]
        )
    )
    async with LLMClient(url) as client:
        stream = client.stream_chat("m", MESSAGES, tools=TOOLS, tool_choice="auto")
        assert await drain(stream) == []
    result = stream.result
    assert server.requests[0]["body"]["tools"] == TOOLS
    assert server.requests[0]["body"]["tool_choice"] == "auto"
    assert server.requests[0]["body"]["stream_options"] == {"include_usage": True}
    assert [call["id"] for call in result.tool_calls] == ["call_a", "call_b"]
    assert [call["function"]["name"] for call in result.tool_calls] == ["get_order", "calculate"]
    arguments = [json.loads(call["function"]["arguments"]) for call in result.tool_calls]
    assert arguments == [{"order_id": "#W1"}, {"expression": "2+2"}]
    assert result.finish_reason == "tool_calls" and result.content == ""
    assert result.usage["total_tokens"] == 14
    assert result.ttft is not None and result.ttft <= result.latency


async def test_json_tool_format_in_a_stream(peer):
    pieces = [
        "Let me check",
        " that. <tool",
        '_call>{"name": "get_order", "argu',
        'ments": {"order_id": "#W1"}}</tool',
        "_call>\n",
    ]
    server, url = await peer(sse(text_chunks(*pieces)))
    system = {"role": "system", "content": "You are a shop assistant."}
    async with LLMClient(url, tool_format="json") as client:
        stream = client.stream_chat("m", [system, *MESSAGES], tools=TOOLS, tool_choice="auto")
        streamed = await drain(stream)
    result = stream.result
    assert "".join(streamed) == result.content == "Let me check that."
    assert not any("<" in piece for piece in streamed)
    (call,) = result.tool_calls
    assert call["function"]["name"] == "get_order"
    assert json.loads(call["function"]["arguments"]) == {"order_id": "#W1"}
    assert result.finish_reason == "tool_calls"
    sent = server.requests[0]["body"]
    assert "tools" not in sent and "tool_choice" not in sent
    prompt = sent["messages"][0]["content"]
    assert prompt.startswith("You are a shop assistant.") and '"name": "get_order"' in prompt
    assert "<tool_call>" in prompt


async def test_json_tool_format_without_streaming(peer):
    content = (
        'Sure.\n<tool_call>{"name": "get_order", "arguments": {"order_id": "#W2"}}</tool_call>'
    )
    body = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 20, "total_tokens": 24},
    }
    server, url = await peer(answer(200, body))
    async with LLMClient(url) as client:
        history = [
            *MESSAGES,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"order_id": "#W1"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "not found"},
        ]
        result = await client.chat("m", history, tools=TOOLS, tool_format="json")
    assert result.content == "Sure."
    assert json.loads(result.tool_calls[0]["function"]["arguments"]) == {"order_id": "#W2"}
    assert result.finish_reason == "tool_calls" and result.usage["completion_tokens"] == 20
    sent = server.requests[0]["body"]["messages"]
    assert sent[0]["role"] == "system" and "get_order" in sent[0]["content"]
    assert "tool_calls" not in sent[2] and '"#W1"' in sent[2]["content"]


async def test_structured_tool_format_sends_the_tool_call_constraint(peer):
    server, url = await peer(sse(text_chunks("ok")), sse(text_chunks("ok")))
    async with LLMClient(url, tool_format="structured") as client:
        await drain(client.stream_chat("m", MESSAGES, tools=TOOLS))
        await drain(client.stream_chat("m", MESSAGES, tools=TOOLS, tool_choice="required"))
        with pytest.raises(ValueError, match="response_format"):
            client.stream_chat("m", MESSAGES, tools=TOOLS, response_format={"type": "json_object"})
    auto, required = (request["body"] for request in server.requests)
    assert "get_order" in auto["messages"][0]["content"]  # described in the JSON format
    assert "tools" not in auto and "tool_choice" not in auto
    assert auto["response_format"] == tool_call_response_format(TOOLS, "auto")
    assert required["response_format"]["format"]["type"] == "tags_with_separator"


async def test_vllm_extras_travel_in_the_request_body(peer):
    completion = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "Hi",
                "token_ids": [5, 6, 2],  # vLLM's extras in a completion choice
                "stop_reason": 2,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
    }
    server, url = await peer(sse(text_chunks("ok")), answer(200, completion))
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    async with LLMClient(url) as client:
        await drain(
            client.stream_chat(
                "m", MESSAGES, top_k=5, skip_special_tokens=False, response_format=schema, seed=3
            )
        )
        result = await client.complete(
            "m", [1, 2, 3], return_token_ids=True, stop_token_ids=[2], top_k=-1, max_tokens=None
        )
    chat_body, completion_body = (request["body"] for request in server.requests)
    assert chat_body["top_k"] == 5 and chat_body["skip_special_tokens"] is False
    assert chat_body["response_format"] == schema and chat_body["seed"] == 3
    assert completion_body["prompt"] == [1, 2, 3] and completion_body["return_token_ids"] is True
    assert completion_body["stop_token_ids"] == [2] and completion_body["top_k"] == -1
    assert "max_tokens" not in completion_body  # None means "not set"
    assert (result.text, result.token_ids, result.stop_reason) == ("Hi", [5, 6, 2], 2)
    assert result.finish_reason == "stop" and result.usage["total_tokens"] == 6


async def test_the_environments_openai_key_never_goes_to_an_engine(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-private")
    with ScriptedServer([{"content": "a"}, {"content": "b"}]) as server:
        async with LLMClient(server.url) as client:
            await client.chat("m", MESSAGES)
        async with LLMClient(server.url, api_key="s3cret") as client:
            await client.chat("m", MESSAGES)
    assert [h["authorization"] for h in server.headers] == ["Bearer EMPTY", "Bearer s3cret"]


async def test_one_client_serves_many_calls_over_one_connection():
    """Whole replies share one connection, streamed ones another (their own pool: see the
    client's docstring), however many calls: not one connection per call."""
    with ScriptedServer([{"content": f"reply {i}"} for i in range(6)]) as server:
        async with LLMClient(server.url) as client:
            for _ in range(3):
                assert (await client.chat("m", MESSAGES)).content.startswith("reply")
                assert "".join(await drain(client.stream_chat("m", MESSAGES))).startswith("reply")
    ports = server.client_ports
    assert len(ports) == 6 and len(set(ports[0::2])) == 1 and len(set(ports[1::2])) == 1


async def test_shared_client_is_one_per_endpoint_and_event_loop():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    client = shared_client(url, timeout=5)
    assert shared_client(url + "/", timeout=5) is client  # the same endpoint
    assert shared_client(url, timeout=6) is not client  # other settings, another client
    assert shared_client(url, api_key="k", timeout=5) is not client

    def on_another_loop():
        async def lookup():
            return shared_client(url, timeout=5)

        return asyncio.run(lookup())

    other = await asyncio.to_thread(on_another_loop)
    assert other is not client  # a pool belongs to the loop it was opened on
    assert shared_client(url, timeout=5) is client
    # the other loop has closed: its clients were dropped at that lookup
    assert list(client_module._shared) == [asyncio.get_running_loop()]
    await client.aclose()
    assert shared_client(url, timeout=5) is not client  # a closed one is replaced


def plain(status: int, text: str):
    """vLLM answers the LoRA endpoints with plain text, not JSON."""

    async def reply(reader, writer):
        payload = text.encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\n"
            f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    return reply


async def test_lora_adapters_load_and_unload_through_the_same_client(peer):
    server, url = await peer(
        plain(200, "Success: LoRA adapter 'arm-a' added successfully."),
        plain(400, "The lora adapter 'arm-a' has already been loaded."),
        plain(200, "Success: LoRA adapter 'arm-a' removed successfully."),
    )
    async with LLMClient(url, max_retries=3, backoff=0.01) as client:
        await client.load_lora_adapter("arm-a", "/ckpt/step-2", replace=True)
        with pytest.raises(LLMHTTPError) as info:
            await client.load_lora_adapter("arm-a", "/ckpt/step-2")
        await client.unload_lora_adapter("arm-a")
    assert info.value.status == 400 and "already been loaded" in str(info.value)
    assert [r["line"] for r in server.requests] == [
        "POST /v1/load_lora_adapter HTTP/1.1",
        "POST /v1/load_lora_adapter HTTP/1.1",  # a refused load is not retried
        "POST /v1/unload_lora_adapter HTTP/1.1",
    ]
    assert server.requests[0]["body"] == {
        "lora_name": "arm-a",
        "lora_path": "/ckpt/step-2",
        "load_inplace": True,
    }
    assert server.requests[2]["body"] == {"lora_name": "arm-a"}
