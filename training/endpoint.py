"""A model on an endpoint for as long as a run: one agents.llm client, opened at the first turn
and kept for every turn after it (no connection set up per turn).

The trainer is synchronous and a client's connections belong to the event loop that opened
them, so each Endpoint keeps an event loop of its own (asyncio.Runner) and runs every call on
it. close() ends the client and the loop; so does the owner's collection at the end of a run
(or the interpreter's exit), whichever comes first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Endpoint:
    def __init__(self, connect: Callable[[], Any]):
        """`connect()` makes the client (an LLMClient) at the first call; it must not refer to
        the Endpoint's owner, or the owner would never be collected."""
        self._open = _Open(connect)
        self._closer = weakref.finalize(self, self._open.close)

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """`work(client)` to its end, on this endpoint's loop."""
        if not self._closer.alive:
            raise RuntimeError("the endpoint is closed")
        return self._open.run(work)

    def close(self) -> None:
        self._closer()  # runs once: a later call, or the collection, does nothing


class _Open:
    """The loop and the client, apart from the Endpoint so its finalizer can hold them."""

    def __init__(self, connect: Callable[[], Any]):
        self.connect = connect
        self.runner: asyncio.Runner | None = None
        self.client: Any = None

    def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        if self.runner is None:
            # a loop of its own: this thread's default loop is left alone
            self.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        return self.runner.run(self._call(work))

    async def _call(self, work: Callable[[Any], Awaitable[T]]) -> T:
        if self.client is None:
            self.client = self.connect()
        return await work(self.client)

    def close(self) -> None:
        if self.runner is None:
            return
        try:
            if self.client is not None:
                self.runner.run(self.client.aclose())
        finally:
            self.runner.close()
            self.runner = self.client = None
