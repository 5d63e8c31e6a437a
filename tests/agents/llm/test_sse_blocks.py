"""The client reads an engine's server-sent events however the bytes are cut: events split
across network reads (mid-line, mid-character), several in one read, CRLF line ends,
comments and multi-line `data:` fields. A raw socket server writes the body in the pieces
given, with a pause between them so that each arrives as a read of its own."""

import asyncio
import json

import pytest

from agents.llm import LLMClient, LLMError

REPLY = ["Bonjour", " café ☕", " 日本語", " done"]


def event(delta: dict, finish=None, end="\n") -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    data = json.dumps({"id": "x", "model": "m", "choices": [choice]}, ensure_ascii=False)
    return f"data: {data}{end}{end}"


def body(end: str = "\n") -> bytes:
    events = [event({"role": "assistant", "content": REPLY[0]}, end=end)]
    events += [f": keep-alive{end}{end}"]  # a comment between events
    events += [event({"content": piece}, end=end) for piece in REPLY[1:]]
    events += [event({}, "stop", end=end), f"data: [DONE]{end}{end}"]
    return "".join(events).encode()


async def serve(pieces: list[bytes]):
    async def answer(reader, writer):
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # the request's head; its body is not needed
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        )
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def streamed(pieces: list[bytes]) -> tuple[list[str], object]:
    server, url = await serve(pieces)
    async with server:
        async with LLMClient(url, max_retries=0) as client:
            stream = client.stream_chat("m", [{"role": "user", "content": "Hi"}])
            got = [piece async for piece in stream]
    return got, stream.result


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 64, 10_000])
@pytest.mark.parametrize("end", ["\n", "\r\n"])
async def test_events_cut_anywhere_give_the_whole_reply(size, end):
    got, result = await streamed(cut(body(end), size))
    assert "".join(got) == "".join(REPLY) == result.content
    assert result.finish_reason == "stop"


async def test_a_data_field_over_several_lines_is_one_event():
    chunk = {"id": "x", "model": "m", "choices": [{"index": 0, "delta": {"content": "two"}}]}
    text = json.dumps(chunk, indent=1)  # JSON over several lines, each a `data:` line
    multi = "".join(f"data: {line}\n" for line in text.splitlines()) + "\n"
    got, result = await streamed([multi.encode(), event({}, "stop").encode(), b"data: [DONE]\n\n"])
    assert "".join(got) == "two" == result.content


async def test_a_malformed_event_is_an_error_that_says_so():
    with pytest.raises(LLMError, match="Malformed event"):
        await streamed([b"data: {not json\n\n"])
