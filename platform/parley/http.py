"""Django's ASGI handler with its middleware run in one thread hop per request.

Django's own ASGI handler runs a sync middleware in a worker thread and an async-capable one
(every MiddlewareMixin: sessions, CSRF, messages ...) on the event loop, and the latter then
hands each of its process_request / process_response methods to a thread again: about a dozen
thread hops a request with this site's MIDDLEWARE, and with the view's own, most of a simple
page's CPU (bench/chat_load.py --profile). Every middleware here can run synchronously and every
view is sync, so the chain runs as under WSGI: one hop to the request's thread for the
middleware and the view together. What runs, and in what order, is Django's own.

That thread is one a finished request gave back, as a threaded WSGI server reuses its
threads. Django gives each request a ThreadSensitiveContext of its own, for which asgiref
starts a new thread and, at the end, a second one to join it: two threads started a request
(`Thread.start` was 1.1% of the server's own CPU in bench/chat_load.py --profile, with what
comes with it). A thread with work still running or queued when its request ends (the client
gone while its view runs) is not given back: it is shut down when that work is done, as
asgiref would.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler

IDLE_THREADS = 32  # request threads kept for reuse in a process; more are shut down


class RequestThread(ThreadPoolExecutor):
    """One thread for one request at a time, which knows whether work is still on it."""

    def __init__(self):
        super().__init__(max_workers=1, thread_name_prefix="request")
        self._lock = threading.Lock()
        self.pending = 0  # submitted and not yet done (finished, failed or cancelled)

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            self.pending += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, future):
        with self._lock:
            self.pending -= 1


class OneHopASGIHandler(ASGIHandler):
    def __init__(self):
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)  # the chain as WSGI builds it
        self.idle: list[RequestThread] = []  # their last request done

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # as Django's: this handler serves HTTP alone
            return await super().__call__(scope, receive, send)
        thread = self.idle.pop() if self.idle else RequestThread()
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            if thread.pending == 0 and len(self.idle) < IDLE_THREADS:
                self.idle.append(thread)
            else:  # its work ends in its own time; shutdown(wait=False) returns at once
                thread.shutdown(wait=False)

    async def get_response_async(self, request):
        # thread_sensitive, as Django runs sync middleware and views: in the request's thread
        # (the ThreadSensitiveContext of __call__).
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def application() -> ASGIHandler:
    """What django.core.asgi.get_asgi_application gives, with the handler above; Django's own
    handler when PARLEY_ONE_HOP_HTTP=0 (the way out if a Django or asgiref upgrade changes the
    internals this module leans on: docs/development.md, Framework internals)."""
    import django
    from django.conf import settings

    django.setup(set_prefix=False)
    if not settings.PARLEY_ONE_HOP_HTTP:
        return ASGIHandler()  # get_asgi_application's own, django.setup done above
    return OneHopASGIHandler()
