"""Token-bucket rate limits per provider and per Twilio sender, with a priority reservation.

`acquire(key, priority)` takes one token or answers False at once (it never waits);
`acquire_many(key, priority, n)` takes up to `n` in one step (one Redis call for all the
recipients of a request) and says how many it got. The send path defers the deliveries
without a token to a near time without calling the provider and without
counting an attempt. A bucket refills `rate` tokens per second up to its capacity.

Priority reservation: `low` may only take a token while the bucket keeps at least
`(1 - low_share) * capacity` tokens after taking it, so a campaign can use at most `low_share`
of a bucket and an OTP (`high`) still finds a token under a full low-priority load. Capacities
are raised where needed so that this reserve holds at least one whole token and low priority
can take at least one. `normal` must leave the whole tokens of `(1 - normal_share) *
capacity` (none in a bucket of fewer than 1 / (1 - normal_share) tokens), so a campaign sent
at `normal` priority (the default of a campaign) does not empty the bucket an OTP needs
either; `high` may use the whole bucket.

Two implementations with one interface: `RedisTokenBucket` (one atomic Lua script, shared by
every process; the clock is Redis's own unless one is injected) and `InProcessTokenBucket`.
Keys without a configured rate are not limited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from retry.settings import RateSpec, RetrySettings
from retry.shared import SharedStateOutage

Clock = Callable[[], float]
PRIORITIES = ("high", "normal", "low")
# Float noise must not turn "exactly one token left above the reserve" into a refusal.
_EPSILON = 1e-9


class RateLimiter(Protocol):
    """Answers whether a send may go out now."""

    async def acquire(self, key: str, priority: str) -> bool:
        """Take one token for `key` ("ses", "twilio:<from or service sid>") at `priority`."""
        ...

    async def acquire_many(self, key: str, priority: str, n: int) -> int:
        """Take up to `n` tokens for `key` at `priority`; how many were taken."""
        ...


@dataclass(frozen=True)
class Bucket:
    """The effective shape of one bucket."""

    rate: float
    capacity: float
    # Tokens a low-priority take must leave in the bucket.
    low_reserve: float
    # Tokens a normal-priority take must leave in the bucket (kept for high).
    high_reserve: float = 0.0

    def floor_for(self, priority: str) -> float:
        """Tokens that must remain after a take at this priority."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        if priority == "low":
            return max(self.low_reserve, self.high_reserve)
        return self.high_reserve if priority == "normal" else 0.0


def bucket_for(spec: RateSpec, low_share: float, normal_share: float = 1.0) -> Bucket:
    """The bucket for a configured rate: capacity defaults to one second's worth of tokens."""
    capacity = spec.burst if spec.burst is not None else max(spec.rate, 1.0)
    if low_share < 1.0:
        # Keep >= 1 whole token for high/normal and let low take >= 1 token.
        capacity = max(capacity, 1.0 / (1.0 - low_share), 1.0 / low_share)
        capacity = float(math.ceil(capacity - _EPSILON))
    # Whole tokens only: a small bucket keeps its behaviour for normal sends.
    high_reserve = float(math.floor((1.0 - normal_share) * capacity + _EPSILON))
    return Bucket(spec.rate, capacity, (1.0 - low_share) * capacity, high_reserve)


class BucketConfig:
    """Resolves a key to its bucket: exact key first, then `<provider>:*`, else unlimited."""

    def __init__(
        self, limits: Mapping[str, RateSpec], low_share: float, normal_share: float = 1.0
    ) -> None:
        if not 0.0 < low_share <= 1.0:
            raise ValueError("low_share must be in (0, 1]")
        if not 0.0 < normal_share <= 1.0:
            raise ValueError("normal_share must be in (0, 1]")
        self._buckets = {
            key: bucket_for(spec, low_share, normal_share) for key, spec in limits.items()
        }

    def lookup(self, key: str) -> Bucket | None:
        """The bucket for `key`, or None when the key is not limited."""
        bucket = self._buckets.get(key)
        if bucket is None and ":" in key:
            bucket = self._buckets.get(key.split(":", 1)[0] + ":*")
        return bucket


def take(
    tokens: float, last: float, now: float, bucket: Bucket, floor: float, n: int = 1
) -> tuple[int, float, float]:
    """The token-bucket step (pure): refill since `last`, then take as many of `n` tokens as
    `floor` allows.

    Returns (taken, tokens, last). A clock that went backwards refills nothing.
    """
    if now > last:
        tokens = min(bucket.capacity, tokens + (now - last) * bucket.rate)
        last = now
    taken = min(n, max(0, math.floor(tokens - floor + _EPSILON)))
    return taken, tokens - taken, last


class InProcessTokenBucket:
    """Buckets in this process's memory (no Redis): same rules, not shared."""

    def __init__(
        self,
        limits: Mapping[str, RateSpec],
        *,
        low_share: float = 0.6,
        normal_share: float = 0.9,
        clock: Clock | None = None,
    ) -> None:
        self._config = BucketConfig(limits, low_share, normal_share)
        self._clock = clock or time.monotonic
        self._state: dict[str, tuple[float, float]] = {}

    async def acquire(self, key: str, priority: str) -> bool:
        """Take one token for `key` at `priority`; False when none is available to it."""
        return await self.acquire_many(key, priority, 1) == 1

    async def acquire_many(self, key: str, priority: str, n: int) -> int:
        """Take up to `n` tokens for `key` at `priority`; how many were taken."""
        bucket = self._config.lookup(key)
        if bucket is None:
            return n
        floor = bucket.floor_for(priority)
        now = self._clock()
        tokens, last = self._state.get(key, (bucket.capacity, now))
        taken, tokens, last = take(tokens, last, now, bucket, floor, n)
        self._state[key] = (tokens, last)
        return taken


# KEYS[1] bucket hash; ARGV: rate, capacity, floor, now (negative = use Redis TIME), ttl ms,
# tokens wanted.
# Same step as `take` above; the state is (tokens, ts) in one hash, expiring once full again.
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local floor = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = capacity
  ts = now
end
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate)
  ts = now
end
local spare = math.max(0, math.floor(tokens - floor + 1e-9))
local want = tonumber(ARGV[6])
local extra = tonumber(ARGV[7] or '0')
-- Tokens leased ahead come only out of plenty: what is left after the lease must be at
-- least LEASE_PLENTY times the lease (else only the needed tokens are taken).
if extra > 0 and spare - want - extra < extra * tonumber(ARGV[8] or '0') then
  extra = 0
end
local taken = math.min(want + extra, spare)
tokens = tokens - taken
redis.call('HSET', KEYS[1], 'tokens', string.format('%.9f', tokens),
           'ts', string.format('%.6f', ts))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return taken
"""


class RedisTokenBucket:
    """Buckets in Redis, shared by every process.

    Tokens are taken from Redis in small leases: a call that finds no leased token left
    takes what it needs plus a few more (at its priority's floor, in one script call) and
    keeps them for the next calls of this process for at most `LEASE_SECONDS`. A lease that
    expires unused is lost, so a process can only send less than the shared rate, never
    more; with small rates (below 1 / LEASE_SECONDS per second) every call goes to Redis.

    The extra tokens follow this process's own demand: as many as it asked for (per key
    and priority) in the current or the previous `LEASE_SECONDS` window, whichever is more,
    and never more than `LEASE_SECONDS` of the rate; and only out of plenty: the script
    grants the extra tokens only when the bucket keeps `LEASE_PLENTY` times as many besides.
    Leases save a Redis call per send where tokens abound (a high limit); where the limit
    binds (processes sharing one rate need more than it allows, as worker processes
    draining a campaign do), a lease only moves scarce tokens to one process, which cannot
    use them all before they expire, while the others find the bucket empty and defer:
    three workers drained a 500/s limit at 350/s when each leased 50 ms of the whole rate,
    and at 485/s without leases.
    """

    LEASE_SECONDS = 0.05
    # A lease is granted only while the bucket keeps this many times the lease besides.
    LEASE_PLENTY = 4

    def __init__(
        self,
        redis: Redis,
        limits: Mapping[str, RateSpec],
        *,
        prefix: str = "gw:",
        low_share: float = 0.6,
        normal_share: float = 0.9,
        clock: Clock | None = None,
        outage: SharedStateOutage | None = None,
    ) -> None:
        self._config = BucketConfig(limits, low_share, normal_share)
        self._outage = outage or SharedStateOutage()
        self._redis = redis
        self._prefix = prefix
        self._clock = clock
        self._script = redis.register_script(_BUCKET_LUA)
        # (key, priority) -> (leased tokens left, local time the lease ends)
        self._leases: dict[tuple[str, str], tuple[int, float]] = {}
        # (key, priority) -> (start of the current window, tokens asked in it, in the last)
        self._demand: dict[tuple[str, str], tuple[float, int, int]] = {}

    async def acquire(self, key: str, priority: str) -> bool:
        """Take one token for `key` at `priority`; False when none is available to it."""
        return await self.acquire_many(key, priority, 1) == 1

    async def acquire_many(self, key: str, priority: str, n: int) -> int:
        """Take up to `n` tokens for `key` at `priority` (leased ones first); how many."""
        bucket = self._config.lookup(key)
        if bucket is None:
            return n
        local = self._clock() if self._clock is not None else time.monotonic()
        demand = self._asked((key, priority), n, local)
        left, until = self._leases.pop((key, priority), (0, 0.0))
        if until <= local:
            left = 0
        if left >= n:
            if left > n:
                self._leases[(key, priority)] = (left - n, until)
            return n
        extra = min(math.floor(bucket.rate * self.LEASE_SECONDS), demand)
        got = await self._take(key, priority, bucket, n - left, extra)
        have = left + got
        if have > n:
            self._leases[(key, priority)] = (have - n, local + self.LEASE_SECONDS)
        return min(n, have)

    def _asked(self, kp: tuple[str, str], n: int, local: float) -> int:
        """Count `n` tokens asked for now; how many more this process is likely to ask for
        within a lease: as many as it asked for so far in the current window (a burst that
        goes on), or in the whole previous window besides these `n` (a steady flow)."""
        start, current, previous = self._demand.get(kp, (local, 0, 0))
        if local - start >= self.LEASE_SECONDS or local < start:
            # A new window; the one that ended counts only if it was the one just before.
            previous = current if 0 <= local - start < 2 * self.LEASE_SECONDS else 0
            start, current = local, 0
        self._demand[kp] = (start, current + n, previous)
        return max(current, previous - n)

    async def _take(self, key: str, priority: str, bucket: Bucket, n: int, extra: int = 0) -> int:
        floor = bucket.floor_for(priority)
        now = self._clock() if self._clock is not None else -1.0
        # Idle buckets are full again after capacity/rate seconds; drop them then.
        ttl_ms = math.ceil(bucket.capacity / bucket.rate * 1000) + 1000
        try:
            result = await self._script(
                keys=[f"{self._prefix}rl:{key}"],
                args=[
                    repr(bucket.rate),
                    repr(bucket.capacity),
                    repr(floor),
                    repr(now),
                    ttl_ms,
                    n,
                    extra,
                    self.LEASE_PLENTY,
                ],
            )
        except (RedisError, OSError) as exc:
            # Raises SharedStateUnavailable: the send path defers (see retry.shared).
            raise self._outage.failed(exc) from exc
        self._outage.succeeded()
        return int(result)


def build_limiter(
    settings: RetrySettings,
    *,
    redis: Redis | None,
    prefix: str,
    clock: Clock | None = None,
    outage: SharedStateOutage | None = None,
) -> RateLimiter:
    """The shared Redis limiter when Redis is configured, else the in-process one. A Redis
    limiter raises `retry.shared.SharedStateUnavailable` when Redis does not answer."""
    if redis is not None:
        return RedisTokenBucket(
            redis,
            settings.rate_limits,
            prefix=prefix,
            low_share=settings.low_priority_share,
            normal_share=settings.normal_priority_share,
            clock=clock,
            outage=outage,
        )
    return InProcessTokenBucket(
        settings.rate_limits,
        low_share=settings.low_priority_share,
        normal_share=settings.normal_priority_share,
        clock=clock,
    )


__all__ = [
    "Bucket",
    "BucketConfig",
    "InProcessTokenBucket",
    "RateLimiter",
    "RedisTokenBucket",
    "bucket_for",
    "build_limiter",
    "take",
]
