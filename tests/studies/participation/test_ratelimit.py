"""The rate limits hold under concurrent events, on Redis as in a process's memory, and their
windows close: exactly `allowed` events pass however many threads or tasks race for them."""

import asyncio
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from studies.participation import ratelimit

LOCMEM = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.fixture(params=["redis", "memory"])
def counted_in(request, settings):
    """The limits on the cache's Redis (REDIS_URL), or in this process's memory (locmem)."""
    if request.param == "redis":
        request.getfixturevalue("redis_url")
        assert ratelimit.cache_redis() is not None
    else:
        settings.CACHES = LOCMEM
    return request.param


def test_the_limit_holds_when_threads_race_for_it(counted_in):
    key = uuid.uuid4().hex  # fresh per run: the Redis may be shared
    with ThreadPoolExecutor(16) as pool:
        passed = list(pool.map(lambda _: ratelimit.hit("race", key, 50), range(400)))
    assert passed.count(True) == 50


@pytest.mark.asyncio
async def test_the_sockets_limit_holds_when_messages_race_for_it(counted_in, settings):
    """The consumer's path: 100 frames of one participant at once, on one event loop."""
    settings.PARLEY_RATE_MESSAGES_PER_PARTICIPANT = 20
    token = uuid.uuid4().hex
    allowed = await asyncio.gather(
        *(ratelimit.message_allowed_async(token, "127.0.0.1") for _ in range(100))
    )
    assert allowed.count(True) == 20


def test_a_window_closes_after_its_length(counted_in):
    key = uuid.uuid4().hex
    assert [ratelimit.hit("window", key, 2, window=1) for _ in range(3)] == [True, True, False]
    time.sleep(1.2)
    assert ratelimit.hit("window", key, 2, window=1)


def test_an_unreachable_redis_lets_events_through_with_a_warning(settings, caplog):
    # Nothing listens on port 1: the connection is refused.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    with caplog.at_level(logging.WARNING, logger="studies.participation.ratelimit"):
        assert all(ratelimit.hit("away", "k", 1) for _ in range(3))
    assert "rate limit storage unavailable; letting away events through" in caplog.text
