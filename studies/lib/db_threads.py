"""Database work off the event loop, for the chat consumer and the bots.

Channels' `database_sync_to_async` runs every socket's database work on one shared thread per
worker, which queues a turn behind every other socket's. `db(function)` runs it in the loop's
thread pool instead; each function given here is self-contained (its own transaction).
"""

import asyncio
import functools

from django.db import connections


def db(function):
    """`function` in a thread of the loop's pool; the connection it opened there goes back to
    the database pool when it returns, so an idle thread holds no place of it.

    A plain `run_in_executor`, not asgiref's `sync_to_async`: these functions need nothing of
    the caller's context, and copying it in and out costs more CPU than a chat turn's query."""

    def closing(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    @functools.wraps(function)
    async def in_pool_thread(*args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(closing, *args, **kwargs))

    return in_pool_thread
