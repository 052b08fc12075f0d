"""Circuit breaker: one suite over the Redis implementation (real Redis) and the in-process one."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest
from redis.asyncio import Redis

from gateway.services import Services
from retry.breaker import BreakerConfig, CircuitBreaker, InProcessBreaker, RedisBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Factory = Callable[[BreakerConfig, FakeClock], CircuitBreaker]
CONFIG = BreakerConfig(
    failure_ratio=0.5,
    min_volume=10,
    window_seconds=60.0,
    cooldown_seconds=30.0,
    account_cooldown_seconds=300.0,
)


@pytest.fixture(params=["redis", "in_process"])
def make_breaker(request: pytest.FixtureRequest, services: Services) -> Factory:
    def make(config: BreakerConfig, clock: FakeClock) -> CircuitBreaker:
        if request.param == "redis":
            assert services.redis is not None
            return RedisBreaker(
                services.redis, config, prefix=services.settings.redis_prefix, clock=clock
            )
        return InProcessBreaker(config, clock=clock)

    return make


async def test_opens_on_failure_ratio_with_minimum_volume(make_breaker: Factory) -> None:
    clock = FakeClock()
    br = make_breaker(CONFIG, clock)
    for _ in range(9):
        await br.record_failure("ses")
    # 9 failures: below the minimum volume, still closed
    assert await br.state("ses") == "closed" and await br.allow("ses")
    for _ in range(11):
        await br.record_success("ses")
    await br.record_failure("ses")  # 10 of 21 failed: under 50 %
    assert await br.state("ses") == "closed"
    await br.record_failure("ses")  # 11 of 22: 50 % -> open
    assert await br.state("ses") == "open"
    assert not await br.allow("ses")
    # the other provider is unaffected
    assert await br.state("twilio") == "closed" and await br.allow("twilio")


async def test_window_slides(make_breaker: Factory) -> None:
    clock = FakeClock()
    br = make_breaker(CONFIG, clock)
    for _ in range(9):
        await br.record_failure("ses")
    clock.now += 61  # those failures left the window
    for _ in range(5):
        await br.record_success("ses")
    for _ in range(4):
        await br.record_failure("ses")
    assert await br.state("ses") == "closed"  # 4 of 9 in the window
    clock.now += 30  # still inside
    await br.record_failure("ses")  # 5 of 10
    assert await br.state("ses") == "open"


async def test_account_level_failure_opens_at_once_with_the_longer_cooldown(
    make_breaker: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    br = make_breaker(CONFIG, clock)
    with caplog.at_level(logging.ERROR, logger="retry.breaker"):
        await br.record_failure("ses", account_level=True)
    assert await br.state("ses") == "open" and not await br.allow("ses")
    assert any("account-level" in r.getMessage() for r in caplog.records)  # the alert
    clock.now += 31  # the ordinary cool-down is not enough
    assert not await br.allow("ses")
    clock.now += 270
    assert await br.state("ses") == "half_open"
    assert await br.allow("ses")


async def test_half_open_allows_exactly_one_probe(make_breaker: Factory) -> None:
    clock = FakeClock()
    br = make_breaker(CONFIG, clock)
    for _ in range(10):
        await br.record_failure("twilio")
    assert await br.state("twilio") == "open"
    clock.now += 29
    assert not await br.allow("twilio")
    clock.now += 1
    assert await br.allow("twilio")  # the probe
    assert [await br.allow("twilio") for _ in range(5)] == [False] * 5
    assert await br.state("twilio") == "half_open"
    await br.record_failure("twilio")  # probe failed: open again, new cool-down
    assert await br.state("twilio") == "open" and not await br.allow("twilio")
    clock.now += 30
    assert await br.allow("twilio")
    await br.record_success("twilio")  # probe succeeded: closed, fresh window
    assert await br.state("twilio") == "closed"
    assert all([await br.allow("twilio") for _ in range(5)])
    for _ in range(9):
        await br.record_failure("twilio")
    assert await br.state("twilio") == "closed"  # the old failures were forgotten


async def test_a_lost_probe_is_replaced_after_a_cooldown(make_breaker: Factory) -> None:
    clock = FakeClock()
    br = make_breaker(CONFIG, clock)
    await br.record_failure("ses", account_level=True)
    clock.now += 300
    assert await br.allow("ses")  # probe granted; its process dies without reporting
    clock.now += 10
    assert not await br.allow("ses")
    clock.now += 20
    assert await br.allow("ses")


async def test_redis_state_is_shared_between_processes(services: Services) -> None:
    assert services.redis is not None
    other = Redis.from_url(services.settings.redis_url or "")
    prefix = services.settings.redis_prefix
    try:
        a = RedisBreaker(services.redis, CONFIG, prefix=prefix)
        b = RedisBreaker(other, CONFIG, prefix=prefix)
        await a.record_failure("ses", account_level=True)
        assert await b.state("ses") == "open" and not await b.allow("ses")
    finally:
        await other.aclose()


async def test_readyz_shows_the_circuits(services: Services, client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    check = response.json()["checks"]["breaker"]
    assert check["ses"] == "closed" and check["twilio"] == "closed"
    await services.breaker.record_failure("twilio", account_level=True)
    response = await client.get("/readyz")
    # an open circuit defers sends; the process still serves
    assert response.status_code == 200
    assert response.json()["checks"]["breaker"]["twilio"] == "open"
