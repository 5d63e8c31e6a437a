"""parley.http's ASGI handler: Django's middleware and view in one thread hop a request, with
the same pages as Django's own handler, on threads that finished requests gave back."""

import asyncio
import re
import threading

import httpx
import pytest
from asgiref import sync
from django.core.handlers.asgi import ASGIHandler
from parley import http

from tests.support.studies import make_study, prolific

pytestmark = pytest.mark.django_db(transaction=True)


def get(app, path: str) -> httpx.Response:
    async def ask():
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.get(path)

    return asyncio.run(ask())


@pytest.fixture
def hops(monkeypatch):
    """Every hand-over of a request's work to a thread (asgiref's SyncToAsync), counted."""
    counted = []
    original = sync.SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        counted.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counting)
    return counted


def test_a_page_takes_three_thread_hops_not_one_per_middleware(hops, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    study = make_study()
    from parley.asgi import application as app  # the site's, as uvicorn serves it

    arrived = get(app, f"/s/{study.slug}/?" + "&".join(f"{k}={v}" for k, v in prolific().items()))
    assert arrived.status_code == 302
    # request_started's receivers, the middleware with the view, the response's close (which
    # sends request_finished); Django's own handler takes one per middleware method besides.
    assert len(hops) == 3, hops
    hops.clear()
    get(ASGIHandler(), arrived.headers["location"])
    assert len(hops) > 10, hops  # what the test would see if the handler were Django's


def test_pages_are_those_of_djangos_own_handler(settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    study = make_study()
    link = f"/s/{study.slug}/?" + "&".join(f"{k}={v}" for k, v in prolific().items())
    ours, theirs = http.OneHopASGIHandler(), ASGIHandler()
    page = get(ours, link).headers["location"]
    for path in (link, page, "/p/not-a-token/", "/healthz", "/s/no-such-study/?x=1"):
        mine, django = get(ours, path), get(theirs, path)
        assert mine.status_code == django.status_code, path
        assert set(mine.headers) == set(django.headers), path
        # the same page, but for its per-request nonce and CSRF token
        scrub = re.compile(r'(nonce|value)="[^"]*"|nonce-[\w-]+')
        assert scrub.sub("", mine.text) == scrub.sub("", django.text), path


def test_requests_reuse_the_thread_a_finished_request_gave_back(settings, monkeypatch):
    settings.ALLOWED_HOSTS = ["testserver"]
    handler = http.OneHopASGIHandler()
    ran_on, respond = [], handler.get_response
    monkeypatch.setattr(
        handler,
        "get_response",
        lambda request: ran_on.append(threading.get_ident()) or respond(request),
    )
    started = []
    monkeypatch.setattr(http, "RequestThread", counted(http.RequestThread, started))
    for _ in range(4):
        assert get(handler, "/healthz").status_code == 200
    assert len(ran_on) == 4 and len(set(ran_on)) == 1
    assert len(started) == 1 and handler.idle == started


def test_a_thread_whose_work_outlives_its_request_is_not_given_back(monkeypatch):
    handler = http.OneHopASGIHandler()
    started = []
    monkeypatch.setattr(http, "RequestThread", counted(http.RequestThread, started))
    release = threading.Event()

    async def handle(scope, receive, send):  # a view still running when the client is gone
        view = asyncio.ensure_future(sync.sync_to_async(release.wait, thread_sensitive=True)())
        await asyncio.sleep(0.05)
        view.cancel()
        await asyncio.gather(view, return_exceptions=True)

    monkeypatch.setattr(handler, "handle", handle)
    try:
        asyncio.run(handler({"type": "http"}, None, None))
        (thread,) = started
        assert thread.pending == 1 and handler.idle == []  # not handed to the next request
    finally:
        release.set()
    thread.shutdown(wait=True)  # it was told to shut down once its work is done: it does
    assert thread.pending == 0


def counted(cls, instances: list):
    class Counted(cls):
        def __init__(self):
            super().__init__()
            instances.append(self)

    return Counted


def test_off_the_site_runs_on_djangos_own_handler(settings):
    """PARLEY_ONE_HOP_HTTP=0: the way out if an upgrade changes the internals used above."""
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.PARLEY_ONE_HOP_HTTP = False
    stock = http.application()
    assert type(stock) is ASGIHandler
    assert get(stock, "/healthz").status_code == 200
    settings.PARLEY_ONE_HOP_HTTP = True
    assert type(http.application()) is http.OneHopASGIHandler
