"""Database work off the event loop, for the chat consumer and the bots.

Channels' `database_sync_to_async` runs every socket's database work on one shared thread per
worker, which queues a turn behind every other socket's. `db(function)` runs it in the loop's
thread pool instead; each function given here is self-contained (its own transaction).
"""

from asgiref.sync import sync_to_async
from django.db import connections


def db(function):
    """`function` in a pool thread; the connection it opened there goes back to the pool when
    it returns. Closed here, inside the call's own context: asgiref runs the function in a
    copy of the caller's context, where Channels' own clean-up never sees that connection,
    and a connection left checked out holds a place of the pool for good."""

    def closing(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return sync_to_async(closing, thread_sensitive=False)
