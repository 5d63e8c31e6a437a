"""Fixed-window rate limits on Django's cache: arrivals per IP, chat messages per participant
and per IP. With several workers the cache must be shared (Redis) for a limit to hold across
them; a per-process cache (locmem) still limits each worker on its own.

Limits are settings with defaults: PARLEY_RATE_ARRIVALS_PER_IP (arrivals per IP a minute),
PARLEY_RATE_MESSAGES_PER_PARTICIPANT and PARLEY_RATE_MESSAGES_PER_IP (chat messages a minute);
0 turns one off. Addresses in PARLEY_RATE_EXEMPT_IPS (default: loopback) are not limited by IP:
a proxy that hides clients' addresses must not put every participant in one bucket, and bots
and load runs on the machine itself must not be throttled.
"""

import asyncio
import functools
import logging
import time
import weakref

from django.conf import settings
from django.core.cache import cache
from django.shortcuts import render

from .errors import FlowError

log = logging.getLogger(__name__)
WINDOW = 60  # seconds

DEFAULTS = {
    "PARLEY_RATE_ARRIVALS_PER_IP": 30,
    "PARLEY_RATE_MESSAGES_PER_PARTICIPANT": 20,
    "PARLEY_RATE_MESSAGES_PER_IP": 120,
}
EXEMPT_IPS = ("127.0.0.1", "::1")


def limit(name: str) -> int:
    return int(getattr(settings, name, DEFAULTS[name]))


def exempt(ip: str | None) -> bool:
    return ip is None or ip in getattr(settings, "PARLEY_RATE_EXEMPT_IPS", EXEMPT_IPS)


def bucket(scope: str, key: str, window: int = WINDOW) -> str:
    return f"parley-rate:{scope}:{key}:{int(time.time() // window)}"


def hit(scope: str, key: str, allowed: int, window: int = WINDOW) -> bool:
    """Count one event for `key` in the current window; False once more than `allowed` fell in it."""
    if allowed <= 0:  # this limit is off
        return True
    try:
        return count(bucket(scope, key, window), window + 1) <= allowed
    except Exception:  # an unreachable cache must not lock participants out
        return unavailable(scope, key)


def unavailable(scope: str, key: str) -> bool:
    log.warning("rate limit cache unavailable; letting %s %s through", scope, key)
    return True


_clients: dict[str, object] = {}


def redis_client():
    """The process's one Redis client for the limiter (None when the cache is not Redis).
    Django's cache gives every async context (every socket) a backend, a connection pool and,
    per call, a client of its own; redis-py's constructor alone cost more than the round trip.
    One client per server, on the pool of the first backend that met it (the write server, the
    only one we set)."""
    backend = getattr(cache, "_cache", None)
    if not hasattr(backend, "get_client"):
        return None
    server = backend._servers[0]
    client = _clients.get(server)
    if client is None:
        client = _clients[server] = backend.get_client(write=True)
    return client


def count(bucket: str, timeout: int) -> int:
    """The bucket's count after this event. On Redis one round trip (INCR; EXPIRE only for the
    window's first event): every chat message passes here, and the cache's add-then-incr took
    two or three. Elsewhere (locmem in development) the cache's own add and incr."""
    client = redis_client()
    if client is not None:  # Django's RedisCache
        name = cache.make_and_validate_key(bucket)
        counted = client.incr(name)
        if counted == 1:
            client.expire(name, timeout)
        return counted
    if cache.add(bucket, 1, timeout=timeout):
        return 1
    try:
        return cache.incr(bucket)
    except ValueError:  # the bucket expired between add and incr: this is its first event
        cache.add(bucket, 1, timeout=timeout)
        return 1


def message_limits(participant_token, ip: str | None) -> list[tuple[str, str, int]]:
    """The limits a chat message frame counts against: the participant's, and the IP's."""
    limits = [("message", str(participant_token), limit("PARLEY_RATE_MESSAGES_PER_PARTICIPANT"))]
    if not exempt(ip):
        limits.append(("message-ip", ip, limit("PARLEY_RATE_MESSAGES_PER_IP")))
    return limits


def message_allowed(participant_token, ip: str | None) -> bool:
    """One chat message frame: within both the participant's and the IP's limit."""
    return all(hit(*limit_) for limit_ in message_limits(participant_token, ip))


_async_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def async_redis_client():
    """The running event loop's asyncio Redis client for the limiter, on the cache's server and
    options (None when the cache is not Redis). One per loop: a client's connections belong to
    the loop that opened them (a test's loop closes; a worker's lives as long as it)."""
    backend = getattr(cache, "_cache", None)
    if not hasattr(backend, "get_client"):
        return None
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        import redis.asyncio

        options = {k: v for k, v in backend._pool_options.items() if k != "parser_class"}
        client = _async_clients[loop] = redis.asyncio.Redis.from_url(backend._servers[0], **options)
    return client


async def message_allowed_async(participant_token, ip: str | None) -> bool:
    """message_allowed for the chat consumer, without blocking its event loop on Redis."""
    client = async_redis_client()
    if client is None:  # the cache in this process: nothing to wait for
        return message_allowed(participant_token, ip)
    for scope, key, allowed in message_limits(participant_token, ip):
        if allowed <= 0:  # this limit is off
            continue
        name, timeout = cache.make_and_validate_key(bucket(scope, key)), WINDOW + 1
        try:
            counted = await client.incr(name)
            if counted == 1:
                await client.expire(name, timeout)
        except Exception:  # an unreachable cache must not lock participants out
            unavailable(scope, key)
            continue
        if counted > allowed:
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
