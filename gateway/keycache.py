"""A small in-process cache of API-key look-ups: SHA-256(secret) -> Principal, for a short TTL.

Every authenticated request needs the caller's principal; without the cache each one would
cost a pooled connection and a round trip. The cache keeps:

* known keys: hash -> principal, for `ttl` seconds (default 5), at most `max_keys` entries;
* unknown or revoked keys: hash -> "no", for `negative_ttl` seconds, at most `max_unknown`
  entries, in a table of their own, so a flood of random bad keys costs at most one query
  each and can neither grow memory nor push real keys out.

Both tables evict their oldest entry when full. Secrets themselves are never kept, only
their hashes. Concurrent misses for the same hash share one query.

Revocation: a key revoked through this process (`DELETE /v1/keys/{id}`) is dropped at once
(`forget`), and a look-up that was under way while it happened is not cached. A key revoked
by another process (another `serve` worker, `gateway keys revoke`) stops working here when
its entry expires: within `ttl` seconds, counted from the start of the look-up that cached it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.keys import Principal, hash_secret, lookup_principal
from suppression.db import DatabaseUnavailable, is_database_unavailable, pg_connection

DEFAULT_TTL_SECONDS = 5.0
"""How long an answer is reused: the longest a revocation made elsewhere takes to apply here."""

DEFAULT_MAX_KEYS = 10_000
DEFAULT_MAX_UNKNOWN = 1_000

Lookup = Callable[[str], Awaitable[Principal | None]]
"""Look a key up by the hash of its secret (None: unknown or revoked)."""


class KeyCache:
    """Principals by secret hash with a TTL, bounded, negative answers included."""

    def __init__(
        self,
        lookup: Lookup,
        *,
        ttl: float = DEFAULT_TTL_SECONDS,
        negative_ttl: float | None = None,
        max_keys: int = DEFAULT_MAX_KEYS,
        max_unknown: int = DEFAULT_MAX_UNKNOWN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lookup = lookup
        self.ttl = ttl
        self.negative_ttl = ttl if negative_ttl is None else negative_ttl
        self._max_keys = max_keys
        self._max_unknown = max_unknown
        self._clock = clock
        self._known: OrderedDict[str, tuple[Principal, float]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._pending: dict[str, asyncio.Task[Principal | None]] = {}
        # Bumped by every invalidation: a look-up that started before one does not cache.
        self._generation = 0

    async def principal(self, secret: str) -> Principal | None:
        """The principal of the key `secret`, or None when it is unknown or revoked."""
        digest = hash_secret(secret)
        now = self._clock()
        known = self._known.get(digest)
        if known is not None and now < known[1]:
            return known[0]
        expires = self._unknown.get(digest)
        if expires is not None and now < expires:
            return None
        task = self._pending.get(digest)
        if task is None:
            task = asyncio.ensure_future(self._fill(digest, now))
            self._pending[digest] = task
            task.add_done_callback(lambda t: self._settled(digest, t))
        # Shielded: a caller that goes away does not cancel the look-up others wait for.
        return await asyncio.shield(task)

    async def _fill(self, digest: str, started: float) -> Principal | None:
        generation = self._generation
        principal = await self._lookup(digest)
        if generation == self._generation:
            self._store(digest, principal, started)
        return principal

    def _settled(self, digest: str, task: asyncio.Task[Principal | None]) -> None:
        if self._pending.get(digest) is task:
            del self._pending[digest]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters have raised it already

    def _store(self, digest: str, principal: Principal | None, started: float) -> None:
        self._known.pop(digest, None)
        self._unknown.pop(digest, None)
        if principal is not None:
            if self.ttl > 0:
                self._known[digest] = (principal, started + self.ttl)
                while len(self._known) > self._max_keys:
                    self._known.popitem(last=False)
        elif self.negative_ttl > 0:
            self._unknown[digest] = started + self.negative_ttl
            while len(self._unknown) > self._max_unknown:
                self._unknown.popitem(last=False)

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop a key (just revoked by this process) so that its next use is looked up again."""
        self._generation += 1
        for digest in [d for d, (p, _) in self._known.items() if p.key_id == key_id]:
            del self._known[digest]
        # Look-ups under way may have read the key before the revocation committed: their
        # waiters get that answer once more (they raced the revocation), later requests a
        # fresh look-up, and none of them is cached.
        self._pending.clear()

    def clear(self) -> None:
        """Forget everything."""
        self._generation += 1
        self._known.clear()
        self._unknown.clear()
        self._pending.clear()

    def __len__(self) -> int:
        """Entries held (known and unknown keys)."""
        return len(self._known) + len(self._unknown)


def database_lookup(engine: AsyncEngine) -> Lookup:
    """The cache-miss query: one statement on an asyncpg connection from `engine`'s pool.

    A pooled connection that turns out to be broken (the server restarted, the backend was
    terminated) is dropped and the read-only look-up tried once more on a fresh one, so a
    request is not refused for the pool's stale connection. If the database stays
    unreachable, `DatabaseUnavailable` says so (the app answers 503), never a driver error.
    """

    async def lookup(secret_hash: str) -> Principal | None:
        for attempt in (1, 2):
            try:
                async with pg_connection(engine) as pg:
                    return await lookup_principal(pg, secret_hash)
            except Exception as exc:
                if not is_database_unavailable(exc):
                    raise
                if attempt == 2:
                    raise DatabaseUnavailable("the API-key look-up failed") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    return lookup
