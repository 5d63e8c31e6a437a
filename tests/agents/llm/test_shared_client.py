"""The process's shared clients: one per event loop, the pools of ended loops closed."""

import asyncio
import gc

from agents.llm.client import shared_client

URL = "http://127.0.0.1:9/v1"  # never called: only the pools are looked at


def test_an_ended_loops_stream_pool_is_closed_when_its_client_is_dropped(recwarn):
    async def open_streams():
        client = shared_client(URL)
        client.stream_session()
        return client

    old = asyncio.run(open_streams())  # asyncio.run ends its loop
    assert not old._streams.closed

    async def next_loop():
        return shared_client(URL)

    new = asyncio.run(next_loop())
    assert new is not old
    # aiohttp's close() is a coroutine that an ended loop can never run: the pool must be
    # closed all the same, and no coroutine left unawaited
    assert old._streams.closed
    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
