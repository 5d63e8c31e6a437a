"""Rate limits on the `limits` library: arrivals per IP, chat messages per participant and per
IP (and, through `limiter`, failed admin logins: parley/security.py). They count where the cache
is: on its Redis (one Lua INCR-and-EXPIRE, atomic, shared by all workers), or with the cache in
each process (locmem, a laptop) in the process's own memory, so each worker limits on its own.

Limits are settings: PARLEY_RATE_ARRIVALS_PER_IP (arrivals per IP a minute),
PARLEY_RATE_MESSAGES_PER_PARTICIPANT and PARLEY_RATE_MESSAGES_PER_IP (chat messages a minute);
0 turns one off. Addresses in PARLEY_RATE_EXEMPT_IPS (default: loopback) are not limited by IP:
a proxy that hides clients' addresses must not put every participant in one bucket, and bots
and load runs on the machine itself must not be throttled.

Fixed windows (a window opens at its first event and lasts its length): one round trip per
event, where a moving window keeps and trims a list of every event's time.
"""

import asyncio
import functools
import logging
import threading
import weakref

from django.conf import settings
from django.shortcuts import render
from limits import RateLimitItemPerSecond
from limits.aio import storage as async_storage
from limits.aio import strategies as async_strategies
from limits.storage import MemoryStorage, RedisStorage
from limits.strategies import FixedWindowRateLimiter

from studies.lib.credentials import keyed_hash
from studies.lib.flow_errors import FlowError

log = logging.getLogger(__name__)
WINDOW = 60  # seconds
# Options of Django's Redis cache that are its own, not the Redis client's.
CACHE_ONLY_OPTIONS = ("parser_class", "pool_class", "serializer")


def limit(name: str) -> int:
    return getattr(settings, name)


def exempt(ip: str | None) -> bool:
    return ip is None or ip in settings.PARLEY_RATE_EXEMPT_IPS


def per_window(allowed: int, window: int = WINDOW) -> RateLimitItemPerSecond:
    return RateLimitItemPerSecond(allowed, window)


def cache_redis() -> tuple[str, str, dict] | None:
    """(URL, key prefix, client options) of the cache's Redis, from its settings; None when the
    cache is not Redis."""
    cache = settings.CACHES["default"]
    if not cache["BACKEND"].endswith(".RedisCache"):
        return None
    location = cache["LOCATION"]
    url = location[0] if isinstance(location, list | tuple) else location.split(",")[0]
    options = {k: v for k, v in cache.get("OPTIONS", {}).items() if k not in CACHE_ONLY_OPTIONS}
    prefix = ":".join(part for part in (cache.get("KEY_PREFIX"), "limits") if part)
    return url, prefix, options


# One limiter per place it counts: a Redis client's constructor costs more than its round trip.
# Made under a lock: threads that each made one for their first event would each count in a
# memory of their own (the race test let 57 of 400 through a limit of 50).
_limiters: dict[str, FixedWindowRateLimiter] = {}
_making = threading.Lock()


def limiter() -> FixedWindowRateLimiter:
    """The process's limiter, on the cache's Redis, or in this process's memory."""
    redis = cache_redis()
    place = repr(redis)
    if place in _limiters:
        return _limiters[place]
    with _making:
        if place not in _limiters:
            if redis is None:
                counts = MemoryStorage()
            else:
                url, prefix, options = redis
                counts = RedisStorage(url, key_prefix=prefix, **options)
            _limiters[place] = FixedWindowRateLimiter(counts)
        return _limiters[place]


def hit(scope: str, key: str, allowed: int, window: int = WINDOW) -> bool:
    """Count one event for `key` in its window; False once more than `allowed` fell in it."""
    if allowed <= 0:  # this limit is off
        return True
    try:
        return limiter().hit(per_window(allowed, window), scope, key)
    except Exception:  # an unreachable Redis must not lock participants out
        return unavailable(scope, key)


def unavailable(scope: str, key: str) -> bool:
    # The key is a participant's token or an IP: the scope alone is said (a token is a credential).
    log.warning("rate limit storage unavailable; letting %s events through", scope)
    return True


def message_limits(participant_token, ip: str | None) -> list[tuple[str, str, int]]:
    """The limits a chat message frame counts against: the participant's, and the IP's."""
    # Counted under a keyed hash of the token: a token is a credential, and the counts' keys sit
    # in Redis where whoever reads it would find them.
    who = keyed_hash(participant_token)
    limits = [("message", who, limit("PARLEY_RATE_MESSAGES_PER_PARTICIPANT"))]
    if not exempt(ip):
        limits.append(("message-ip", ip, limit("PARLEY_RATE_MESSAGES_PER_IP")))
    return limits


def message_allowed(participant_token, ip: str | None) -> bool:
    """One chat message frame: within both the participant's and the IP's limit."""
    return all(hit(*limit_) for limit_ in message_limits(participant_token, ip))


_async_limiters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def async_limiter() -> async_strategies.FixedWindowRateLimiter | None:
    """The running event loop's limiter on the cache's Redis (None when the cache is not
    Redis), counting in the same keys as `limiter`. One per loop: a client's connections
    belong to the loop that opened them (a test's loop closes; a worker's lives as long as it)."""
    redis = cache_redis()
    if redis is None:
        return None
    per_loop = _async_limiters.setdefault(asyncio.get_running_loop(), {})
    place = repr(redis)
    if place not in per_loop:
        url, prefix, options = redis
        counts = async_storage.RedisStorage(
            "async+" + url, implementation="redispy", key_prefix=prefix, **options
        )
        per_loop[place] = async_strategies.FixedWindowRateLimiter(counts)
    return per_loop[place]


async def message_allowed_async(participant_token, ip: str | None) -> bool:
    """message_allowed for the chat consumer, without blocking its event loop on Redis."""
    limiter_ = async_limiter()
    if limiter_ is None:  # counted in this process's memory: nothing to wait for
        return message_allowed(participant_token, ip)
    for scope, key, allowed in message_limits(participant_token, ip):
        if allowed <= 0:  # this limit is off
            continue
        try:
            within = await limiter_.hit(per_window(allowed), scope, key)
        except Exception:  # an unreachable Redis must not lock participants out
            unavailable(scope, key)
            continue
        if not within:
            return False
    return True


def limit_arrivals(view):
    """At most PARLEY_RATE_ARRIVALS_PER_IP arrivals per IP a minute; more get a 429 page."""

    @functools.wraps(view)
    def limited(request, *args, **kwargs):
        ip = request.META.get("REMOTE_ADDR")
        if not exempt(ip) and not hit("arrival", ip, limit("PARLEY_RATE_ARRIVALS_PER_IP")):
            error = FlowError(
                "Too many requests",
                "Too many study links were opened from your network just now. "
                "Please wait a minute and open the link again.",
                status=429,
            )
            return render(request, "studies/problem.html", {"error": error}, status=429)
        return view(request, *args, **kwargs)

    return limited
