"""Which replica of an endpoint serves a call.

An endpoint may have several replicas (servers with the same models). A conversation sticks to
one: its key (a participant's token, say) ranks the replicas by rendezvous hashing, so the same
key always prefers the same replica, keys spread evenly, and when a replica is added or removed
only the conversations it gained or lost move. Calls without a key take the replicas in turn.

A replica that could not be reached is remembered as down in this process for DOWN_FOR seconds
(every client shares that memory): every call's order puts it last, so the next turn of each
of its conversations goes straight to the next replica in its own order (failover), and after
that time the replica is tried first again by its own conversations. Replicas the caller knows
to be down (the registry's last health check) go last too. Nothing is ever left out: with every
replica down the call still tries them all.
"""

import hashlib
import itertools
import time
from collections.abc import Collection

DOWN_FOR = 30.0  # seconds a replica that refused a connection is tried last

_down_until: dict[str, float] = {}  # replica URL -> monotonic time; this process's memory


def mark_down(url: str, seconds: float = DOWN_FOR) -> None:
    _down_until[url] = time.monotonic() + seconds


def mark_up(url: str) -> None:
    _down_until.pop(url, None)


def seen_down(url: str) -> bool:
    until = _down_until.get(url)
    return until is not None and until > time.monotonic()


def _weight(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()


class Replicas:
    """The base URLs of one endpoint's replicas, in the order given (the first is the one a
    single-replica endpoint has)."""

    def __init__(self, urls):
        self.urls = tuple(dict.fromkeys(url.rstrip("/") for url in urls))
        if not self.urls:
            raise ValueError("An endpoint needs at least one replica URL.")
        self._turn = itertools.count()

    def __len__(self) -> int:
        return len(self.urls)

    def order(self, key: str | None = None, avoid: Collection[str] = ()) -> list[str]:
        """Every replica, in the order a call should try them: the key's own ranking (or the
        next in turn, without a key), those seen down or in `avoid` moved to the end."""
        if len(self.urls) == 1:
            return list(self.urls)
        if key is None:
            start = next(self._turn) % len(self.urls)
            ranked = [*self.urls[start:], *self.urls[:start]]
        else:
            ranked = sorted(self.urls, key=lambda url: _weight(key, url), reverse=True)
        usable = [url for url in ranked if url not in avoid and not seen_down(url)]
        return usable + [url for url in ranked if url not in usable]


class Failover:
    """The replicas one call tries, attempt by attempt: its order's first, then each one it has
    not tried yet; once all have been tried, round again (the same replica, with one)."""

    def __init__(self, replicas: Replicas, key: str | None = None, avoid: Collection[str] = ()):
        self.order = replicas.order(key, avoid)
        self.tried: list[str] = []

    def next(self) -> str:
        untried = [url for url in self.order if url not in self.tried]
        url = untried[0] if untried else self.order[len(self.tried) % len(self.order)]
        self.tried.append(url)
        return url

    def switches(self) -> bool:
        """The next attempt goes to a replica not tried yet (no reason to wait before it)."""
        return len(self.tried) < len(self.order)
