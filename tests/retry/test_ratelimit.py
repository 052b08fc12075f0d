"""Token buckets: one suite over the Redis implementation (real Redis) and the in-process one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.services import Services
from retry.ratelimit import InProcessTokenBucket, RateLimiter, RedisTokenBucket, bucket_for
from retry.settings import RateSpec


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Factory = Callable[..., RateLimiter]


@pytest.fixture(params=["redis", "in_process"])
def make_limiter(request: pytest.FixtureRequest, services: Services) -> Factory:
    def make(limits: dict[str, RateSpec], clock: FakeClock, low_share: float = 0.6) -> RateLimiter:
        if request.param == "redis":
            assert services.redis is not None
            return RedisTokenBucket(
                services.redis,
                limits,
                prefix=services.settings.redis_prefix,
                low_share=low_share,
                clock=clock,
            )
        return InProcessTokenBucket(limits, low_share=low_share, clock=clock)

    return make


async def _drain(limiter: RateLimiter, key: str, priority: str) -> int:
    taken = 0
    while await limiter.acquire(key, priority):
        taken += 1
        assert taken < 10_000
    return taken


async def test_burst_then_refill_at_the_rate(make_limiter: Factory) -> None:
    clock = FakeClock()
    limiter = make_limiter({"ses": RateSpec(10.0, 20.0)}, clock)
    assert await _drain(limiter, "ses", "high") == 20
    clock.now += 0.5  # 5 tokens
    assert await _drain(limiter, "ses", "high") == 5
    clock.now += 100  # refill stops at the capacity
    assert await _drain(limiter, "ses", "high") == 20
    # a clock that goes backwards refills nothing
    clock.now -= 50
    assert not await limiter.acquire("ses", "high")


async def test_many_tokens_in_one_step_follow_the_same_rules(make_limiter: Factory) -> None:
    clock = FakeClock()
    limiter = make_limiter({"ses": RateSpec(10.0, 10.0), "twilio:*": RateSpec(1.0)}, clock)
    # low may take 6 of 10 whatever it asks for; then high/normal get the reserved 4
    assert await limiter.acquire_many("ses", "low", 100) == 6
    assert await limiter.acquire_many("ses", "low", 1) == 0
    assert await limiter.acquire_many("ses", "normal", 3) == 3
    assert await limiter.acquire_many("ses", "high", 5) == 1
    clock.now += 0.25  # 2.5 tokens: whole ones only
    assert await limiter.acquire_many("ses", "high", 5) == 2
    assert await limiter.acquire("ses", "high") is False
    # unconfigured keys are not limited
    assert await limiter.acquire_many("unlimited", "low", 50) == 50


async def test_low_priority_uses_at_most_its_share(make_limiter: Factory) -> None:
    clock = FakeClock()
    limiter = make_limiter({"ses": RateSpec(10.0, 10.0)}, clock)
    # low may take 6 of 10; the remaining 4 stay for high/normal
    assert await _drain(limiter, "ses", "low") == 6
    assert await _drain(limiter, "ses", "high") == 4
    clock.now += 0.3  # 3 tokens: below the reserve, so low still gets nothing
    assert not await limiter.acquire("ses", "low")
    # normal leaves 10 % (1 whole token) for high
    assert await _drain(limiter, "ses", "normal") == 2
    assert await _drain(limiter, "ses", "high") == 1


async def test_normal_priority_leaves_a_tenth_of_the_bucket_for_high(
    make_limiter: Factory,
) -> None:
    clock = FakeClock()
    limiter = make_limiter({"twilio:*": RateSpec(500.0)}, clock)
    key = "twilio:+15005550006"
    # a campaign at normal priority takes all it may: 450 of the 500 tokens ...
    assert await limiter.acquire_many(key, "normal", 1000) == 450
    assert await limiter.acquire_many(key, "normal", 1) == 0
    # ... and OTPs still find the other 50 at once
    assert await limiter.acquire_many(key, "high", 60) == 50
    # refilled: normal keeps taking at the full rate while the reserve is there
    clock.now += 0.1  # 50 tokens
    assert await limiter.acquire_many(key, "high", 1) == 1
    assert await limiter.acquire_many(key, "normal", 100) == 0
    clock.now += 1.0
    assert await limiter.acquire_many(key, "normal", 1000) == 450


async def test_an_otp_gets_a_token_under_a_full_low_priority_load(make_limiter: Factory) -> None:
    clock = FakeClock()
    limiter = make_limiter({"twilio:*": RateSpec(1.0)}, clock)  # a long code: 1 SMS/s
    key = "twilio:+15005550006"
    low_sent = 0
    for _ in range(600):  # a campaign hammering the sender for a minute, 10 tries a second
        clock.now += 0.1
        low_sent += await limiter.acquire(key, "low")
    # the campaign got (about) the sender's whole rate ...
    assert 55 <= low_sent <= 62
    # ... and the OTP still gets a token at once
    assert await limiter.acquire(key, "high")


async def test_keys_are_separate_and_unconfigured_keys_unlimited(make_limiter: Factory) -> None:
    clock = FakeClock()
    limiter = make_limiter(
        {"twilio:*": RateSpec(1.0, 3.0), "twilio:MG123": RateSpec(100.0, 100.0)}, clock
    )
    assert await _drain(limiter, "twilio:+15550001", "normal") == 3
    assert await _drain(limiter, "twilio:+15550002", "normal") == 3
    assert await _drain(limiter, "twilio:MG123", "high") == 100
    for _ in range(1000):
        assert await limiter.acquire("sandbox", "low")
    with pytest.raises(ValueError):
        await limiter.acquire("twilio:+15550003", "urgent")


async def test_bucket_shapes() -> None:
    # capacity defaults to one second of tokens, raised so that the reserve holds a whole
    # token and low priority can take one
    assert bucket_for(RateSpec(14.0), 0.6).capacity == 14.0
    one = bucket_for(RateSpec(1.0), 0.6)
    assert one.capacity == 3.0 and one.low_reserve >= 1.0
    assert bucket_for(RateSpec(1.0), 1.0).capacity == 1.0
    assert bucket_for(RateSpec(5.0, 2.0), 0.9).capacity == 10.0
    # normal leaves whole tokens only: none in a bucket of fewer than 10 at share 0.9
    assert bucket_for(RateSpec(1.0), 0.6, 0.9).high_reserve == 0.0
    assert bucket_for(RateSpec(14.0), 0.6, 0.9).high_reserve == 1.0
    assert bucket_for(RateSpec(500.0), 0.6, 0.9).floor_for("normal") == 50.0
    assert bucket_for(RateSpec(500.0), 0.6, 0.9).floor_for("low") == 200.0
    assert bucket_for(RateSpec(500.0), 0.6, 0.9).floor_for("high") == 0.0


async def test_redis_buckets_are_shared_between_limiters(services: Services) -> None:
    assert services.redis is not None
    limits = {"ses": RateSpec(0.001, 50.0)}
    prefix = services.settings.redis_prefix
    # two "processes": separate clients, same Redis; the server's clock
    other = Redis.from_url(services.settings.redis_url or "")
    try:
        a = RedisTokenBucket(services.redis, limits, prefix=prefix)
        b = RedisTokenBucket(other, limits, prefix=prefix)
        results = await asyncio.gather(*(lim.acquire("ses", "high") for lim in [a, b] * 40))
    finally:
        await other.aclose()
    assert sum(results) == 50


async def test_in_process_limiter_is_the_default_without_redis(services: Services) -> None:
    from retry.ratelimit import build_limiter

    assert isinstance(
        build_limiter(services.settings.retry, redis=None, prefix="x:"), InProcessTokenBucket
    )
    assert isinstance(services.limiter, RedisTokenBucket)


async def test_redis_tokens_are_leased_briefly_and_never_exceed_the_shared_rate(
    services: Services,
) -> None:
    assert services.redis is not None
    clock = FakeClock()
    prefix = services.settings.redis_prefix + "lease:"
    limits = {"ses": RateSpec(1000.0, 1000.0)}
    a = RedisTokenBucket(services.redis, limits, prefix=prefix, clock=clock)
    b = RedisTokenBucket(services.redis, limits, prefix=prefix, clock=clock)
    calls = 0
    take = a._take

    async def counted(key: str, priority: str, bucket: Any, n: int, extra: int = 0) -> int:
        nonlocal calls
        calls += 1
        return await take(key, priority, bucket, n, extra)

    a._take = counted  # type: ignore[method-assign]
    # The first call of a burst takes only its own token; each later Redis call leases as
    # many more as this process asked for so far (here: 1, 3, 7, 15, 31), so 63 sends need
    # 6 Redis calls ...
    for _ in range(63):
        assert await a.acquire("ses", "high")
    assert calls == 6
    # ... and a lease never holds more than 0.05 s of the rate (50 tokens)
    assert await a.acquire("ses", "high") and calls == 7
    for _ in range(50):
        assert await a.acquire("ses", "high")
    assert calls == 7
    # what process `a` leased is gone from the shared bucket: `b` gets the rest, no more
    assert await b.acquire_many("ses", "high", 10_000) == 1000 - 63 - 51
    # a lease ends after 0.05 s; tokens not used by then are lost, never spent later: after
    # a second the bucket is full again and that is all anyone gets
    clock.now += 1.0
    assert await a.acquire_many("ses", "high", 10_000) == 1000


async def test_a_steady_process_leases_about_what_it_uses(services: Services) -> None:
    """A worker sending one message every 20 ms leases a token or two ahead, not 0.05 s of
    the whole rate: leased tokens that expire unused are lost to every process sharing the
    rate (3 workers drained a 500/s limit at 350/s when each leased 25 at a time)."""
    assert services.redis is not None
    clock = FakeClock()
    prefix = services.settings.redis_prefix + "steady:"
    limiter = RedisTokenBucket(
        services.redis, {"twilio:*": RateSpec(500.0)}, prefix=prefix, clock=clock
    )
    asked: list[int] = []
    take = limiter._take

    async def counted(key: str, priority: str, bucket: Any, n: int, extra: int = 0) -> int:
        got = await take(key, priority, bucket, n, extra)
        asked.append(got)
        return got

    limiter._take = counted  # type: ignore[method-assign]
    for _ in range(100):
        clock.now += 0.02
        assert await limiter.acquire("twilio:+15005550006", "low")
    # A token or two ahead (2-3 are asked per 50 ms), fewer Redis calls than sends, and
    # nearly every token taken from the shared bucket was used.
    assert max(asked) <= 4
    assert len(asked) < 60
    assert sum(asked) <= 110


async def test_tokens_are_leased_only_out_of_plenty(services: Services) -> None:
    """A lease is granted only while the bucket keeps four times as many tokens besides:
    scarce tokens leased ahead would be taken from the processes that need them now."""
    assert services.redis is not None
    clock = FakeClock()
    prefix = services.settings.redis_prefix + "plenty:"
    limits = {"twilio:*": RateSpec(100.0, 100.0)}
    a = RedisTokenBucket(services.redis, limits, prefix=prefix, clock=clock)
    b = RedisTokenBucket(services.redis, limits, prefix=prefix, clock=clock)
    calls: list[tuple[int, int, int]] = []
    take = a._take

    async def counted(key: str, priority: str, bucket: Any, n: int, extra: int = 0) -> int:
        got = await take(key, priority, bucket, n, extra)
        calls.append((n, extra, got))
        return got

    a._take = counted  # type: ignore[method-assign]
    key = "twilio:+15005550006"
    # A burst of 4 from a full bucket: each Redis call leases what was asked so far.
    for _ in range(4):
        assert await a.acquire(key, "high")
    assert calls == [(1, 0, 1), (1, 1, 2), (1, 3, 4)]
    # Another process leaves 8 tokens (after `a`'s lease of 3): `a` still gets a lease of
    # one (6 remain besides, >= 4 x 1), but not one of three (4 would remain, < 4 x 3).
    clock.now += 1.5
    assert await b.acquire_many(key, "high", 92) == 92
    calls.clear()
    for _ in range(4):
        assert await a.acquire(key, "high")
    assert calls == [(1, 0, 1), (1, 1, 2), (1, 3, 1)]
    assert await b.acquire_many(key, "high", 1000) == 8 - 4


def test_normal_share_setting() -> None:
    from gateway.settings import SettingsError, load_settings

    assert load_settings({}).retry.normal_priority_share == 0.9
    assert load_settings({"GATEWAY_RATE_NORMAL_SHARE": "1"}).retry.normal_priority_share == 1.0
    for bad in ("0", "1.5", "x"):
        with pytest.raises(SettingsError, match="GATEWAY_RATE_NORMAL_SHARE"):
            load_settings({"GATEWAY_RATE_NORMAL_SHARE": bad})
