"""Fixtures of the push tests: a TLS test CA, an HTTPS receiver, settings that trust the CA
and allow local receivers, with a short retry schedule, and a movable clock."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.services import Services
from gateway.settings import OutboundSettings, Settings
from tests.conftest import replace_settings
from tests.webhooks.outbound.receiver import Receiver, make_tls
from webhooks.outbound.client import PushClient
from webhooks.outbound.pusher import OutboundWorker, Pusher

# Short tries and a schedule of two immediate retries (a setting, not a patch).
TEST_OUTBOUND = OutboundSettings(
    allow_private=True,
    retry_schedule=(0.0, 0.0),
    connect_timeout_seconds=2.0,
    read_timeout_seconds=3.0,
    poll_seconds=0.05,
)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA bundle, server certificate, server key) of a test CA."""
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def settings(settings: Settings, tls_files: tuple[Path, Path, Path]) -> Settings:
    """The suite's settings, with outbound pushes trusting the test CA."""
    return replace_settings(
        settings, outbound=dataclasses.replace(TEST_OUTBOUND, ca_bundle=str(tls_files[0]))
    )


@pytest.fixture
def receiver(tls_files: tuple[Path, Path, Path]) -> Iterator[Receiver]:
    """An HTTPS receiver with a certificate of the test CA for `localhost`."""
    with Receiver((tls_files[1], tls_files[2])) as r:
        yield r


class Clock:
    """A clock the test moves (the pushers' scheduling clock)."""

    def __init__(self) -> None:
        # A second ahead of real time: what a test queues just after is due at once.
        self.now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += dt.timedelta(**delta)


@contextlib.asynccontextmanager
async def pushing(
    services: Services, *, clock: Clock | None = None, settings: OutboundSettings | None = None
) -> AsyncIterator[OutboundWorker]:
    """A push worker on the test's services, with its own clock, and with its own client for
    other settings when given (closed afterwards)."""
    outbound = services.outbound
    client = outbound.client
    if settings is not None:
        client = PushClient(
            allow_private=settings.allow_private,
            connect_timeout=settings.connect_timeout_seconds,
            read_timeout=settings.read_timeout_seconds,
            max_connections=settings.concurrency,
            ca_bundle=settings.ca_bundle,
        )
    pusher = Pusher(
        services.engine,
        services.protector,
        settings or services.settings.outbound,
        outbound.feed,
        client,
        clock=clock or outbound.pusher.now,
    )
    try:
        yield OutboundWorker(pusher, outbound.feed)
    finally:
        if client is not outbound.client:
            await client.close()
