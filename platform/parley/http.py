"""Django's ASGI handler with its middleware run in one thread hop per request.

Django's own ASGI handler runs a sync middleware in a worker thread and an async-capable one
(every MiddlewareMixin: sessions, CSRF, messages ...) on the event loop, and the latter then
hands each of its process_request / process_response methods to a thread again: about a dozen
thread hops a request with this site's MIDDLEWARE, and with the view's own, most of a simple
page's CPU (bench/chat_load.py --profile). Every middleware here can run synchronously and every
view is sync, so the chain runs as under WSGI: one hop to the request's thread for the
middleware and the view together. What runs, and in what order, is Django's own.
"""

from asgiref.sync import sync_to_async
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler


class OneHopASGIHandler(ASGIHandler):
    def __init__(self):
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)  # the chain as WSGI builds it

    async def get_response_async(self, request):
        # thread_sensitive, as Django runs sync middleware and views: in the thread that
        # ASGIHandler's ThreadSensitiveContext gives this request.
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def application() -> OneHopASGIHandler:
    """What django.core.asgi.get_asgi_application gives, with the handler above."""
    import django

    django.setup(set_prefix=False)
    return OneHopASGIHandler()
