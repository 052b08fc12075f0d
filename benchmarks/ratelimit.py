"""Figures for the rate limiter and the circuit breaker (prints numbers; not a test).

    .venv/bin/python benchmarks/ratelimit.py [--redis redis://127.0.0.1:6379/0] [--seconds 2]

1. Throughput of `acquire` (in-process; Redis sequential and with 32 concurrent callers), and
   of the breaker's `allow` + `record_success` pair.
2. Priority reservation, simulated on a virtual clock: a 1 SMS/s sender hammered by a
   campaign (10 low-priority tries per second) while OTPs arrive at random; how many OTPs got
   a token at once, and how much of the rate the campaign used.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from redis.asyncio import Redis

from retry.breaker import BreakerConfig, InProcessBreaker, RedisBreaker
from retry.ratelimit import InProcessTokenBucket, RateLimiter, RedisTokenBucket
from retry.settings import RateSpec


async def _rate(label: str, op: object, seconds: float, concurrency: int = 1) -> None:
    done = 0
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await op()  # type: ignore[operator]
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    print(f"  {label:<52} {done / elapsed:>10,.0f} ops/s")


async def throughput(redis_url: str | None, seconds: float) -> None:
    print("throughput")
    limits = {"ses": RateSpec(1e9, 1e9)}  # never empty: measures the call, not refusals
    local = InProcessTokenBucket(limits)
    await _rate("in-process acquire", lambda: local.acquire("ses", "normal"), seconds)
    breaker = InProcessBreaker()

    async def pair_local() -> None:
        await breaker.allow("ses")
        await breaker.record_success("ses")

    await _rate("in-process breaker allow + record_success", pair_local, seconds)
    if not redis_url:
        print("  (no Redis: pass --redis or set REDIS_URL for the shared implementations)")
        return
    redis = Redis.from_url(redis_url)
    prefix = f"gwbench:{uuid.uuid4().hex[:8]}:"
    try:
        shared = RedisTokenBucket(redis, limits, prefix=prefix)
        await _rate("Redis acquire, 1 caller", lambda: shared.acquire("ses", "normal"), seconds)
        await _rate(
            "Redis acquire, 32 concurrent callers",
            lambda: shared.acquire("ses", "normal"),
            seconds,
            concurrency=32,
        )
        rbreaker = RedisBreaker(redis, BreakerConfig(), prefix=prefix)

        async def pair_redis() -> None:
            await rbreaker.allow("ses")
            await rbreaker.record_success("ses")

        await _rate("Redis breaker allow + record_success", pair_redis, seconds)
    finally:
        keys = [k async for k in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def reservation(limiter_factory: type[InProcessTokenBucket]) -> None:
    print("priority reservation (virtual clock, 1 SMS/s sender, one hour)")
    rng = random.Random(5)
    for share in (1.0, 0.6):
        clock = [0.0]
        limiter: RateLimiter = limiter_factory(
            {"twilio:*": RateSpec(1.0)}, low_share=share, clock=lambda c=clock: c[0]
        )
        otp_due: list[float] = []
        otp_waits: list[float] = []
        low_sent = 0
        step = 0.1
        for tick in range(36_000):
            clock[0] = tick * step
            if rng.random() < 0.02:  # an OTP every ~5 s on average
                otp_due.append(clock[0])
            while otp_due and await limiter.acquire("twilio:+15550001", "high"):
                otp_waits.append(clock[0] - otp_due.pop(0))
            low_sent += await limiter.acquire("twilio:+15550001", "low")
        immediate = sum(1 for w in otp_waits if w == 0) / max(1, len(otp_waits))
        print(
            f"  low share {share:.0%}: OTPs sent at once {immediate:6.1%}, "
            f"max OTP wait {max(otp_waits):4.1f} s, campaign sent {low_sent} "
            f"({low_sent / 3600:.2f}/s)"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL"))
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    await throughput(args.redis, args.seconds)
    await reservation(InProcessTokenBucket)


if __name__ == "__main__":
    asyncio.run(main())
