"""Redis (the shared rate limiter and circuit breaker) lost and back, with a real Redis server
of the test's own that is stopped and started again on the same port.

While it is down, sends fail safe: 202 with each delivery `queued`, reason
`deferred: rate limiter unavailable`, no provider call; the outage is logged once when it
starts and once when it ends (no traceback per request); `/readyz` says `degraded`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from gateway.settings import Settings
from retry.settings import RateSpec
from retry.shared import UNAVAILABLE_REASON
from tests.sender.helpers import Gateway, provider_settings, sms
from tests.stubs.twilio_stub import TwilioStub
from tests.support.process import free_port

REDIS_SERVER = str(Path(sys.executable).with_name("redis-server"))


class OwnRedis:
    """A redis-server process on a fixed port that a test can stop and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="gwredis")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        for _ in range(200):
            with contextlib.suppress(redis.exceptions.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server not installed in the virtualenv")
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture
async def outage_gateway(
    settings: Settings,
    own_redis: OwnRedis,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> AsyncIterator[Gateway]:
    base = provider_settings(settings, twilio_api_base=twilio_stub.url, redis_url=own_redis.url)
    # A limited key whose rate is too small for local leases (RedisTokenBucket.LEASE_SECONDS),
    # so every send asks the shared limiter; the burst covers every send of the test.
    retry = dataclasses.replace(base.retry, rate_limits={"twilio:*": RateSpec(10.0, 100.0)})
    async with make_gateway(dataclasses.replace(base, retry=retry)) as gw:
        yield gw


async def test_sends_are_deferred_with_a_reason_while_redis_is_down(
    outage_gateway: Gateway,
    own_redis: OwnRedis,
    twilio_stub: TwilioStub,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw = outage_gateway
    first = await gw.send(sms("+15005550006"))
    assert first.status_code == 201, first.text
    assert first.json()["deliveries"][0]["status"] == "sent"
    calls = twilio_stub.count

    own_redis.stop()
    caplog.set_level(logging.INFO)
    caplog.clear()
    for _ in range(5):
        r = await gw.send(sms(["+15005550006", "+14155552671"]))
        assert r.status_code == 202, r.text
        for d in r.json()["deliveries"]:
            assert (d["status"], d["reason"]) == ("queued", UNAVAILABLE_REASON)
    assert twilio_stub.count == calls  # no provider call while the limiter cannot answer

    ready = await gw.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "degraded"
    assert ready.json()["checks"]["redis"]["ok"] is False
    assert UNAVAILABLE_REASON in ready.json()["checks"]["redis"]["effect"]

    # One line for the outage, no traceback per request.
    down = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(down) == 1, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]

    own_redis.start()
    caplog.clear()
    back = await gw.send(sms("+15005550006"))
    assert back.status_code == 201, back.text
    assert back.json()["deliveries"][0]["status"] == "sent"
    assert len([r for r in caplog.records if "available again" in r.getMessage()]) == 1
    ready = await gw.client.get("/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
