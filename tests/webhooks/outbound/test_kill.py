"""At-least-once across crashes: a `gateway worker` killed with SIGKILL while its push is
under way (claim committed, no answer recorded) loses nothing: another worker process pushes
the same event, with the same webhook-id, once the dead one's lease has run out."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from gateway.services import Services
from gateway.settings import Settings
from suppression.db import pg_connection
from tests.conftest import bearer, gateway_env
from tests.sender.helpers import email
from tests.support.process import GATEWAY, clean_env
from tests.webhooks.outbound.receiver import HANG, Receiver

from .helpers import create_endpoint

MakeKey = Callable[..., Awaitable[str]]


def _worker(settings: Settings, ca_bundle: Path) -> subprocess.Popen[bytes]:
    assert settings.database_url is not None and settings.redis_url is not None
    env = clean_env(
        **gateway_env(
            settings.database_url,
            settings.redis_url,
            GATEWAY_REDIS_PREFIX=settings.redis_prefix,
            GATEWAY_WEBHOOK_ALLOW_PRIVATE="true",
            GATEWAY_WEBHOOK_CA_BUNDLE=str(ca_bundle),
            GATEWAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS="0.5",
            GATEWAY_WEBHOOK_READ_TIMEOUT_SECONDS="1",
            GATEWAY_WEBHOOK_POLL_SECONDS="0.05",
            GATEWAY_LOG_LEVEL="WARNING",
        )
    )
    return subprocess.Popen(
        [GATEWAY, "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


async def _recorded(services: Services, event_id: str) -> None:
    """Wait until the try's outcome is recorded (a guard against hanging, not a timing)."""
    for _ in range(300):
        async with pg_connection(services.engine) as conn:
            status = await conn.fetchval(
                "SELECT status FROM webhook_deliveries WHERE event_id = $1", event_id
            )
        if status != "pending":
            return
        await asyncio.sleep(0.1)


async def test_a_worker_killed_mid_push_loses_no_event(
    client: httpx.AsyncClient,
    make_key: MakeKey,
    receiver: Receiver,
    services: Services,
    settings: Settings,
    tls_files: tuple[Path, Path, Path],
) -> None:
    admin = await make_key("admin")
    sender = await make_key("send", "read")
    endpoint = await create_endpoint(client, admin, receiver, events=["delivery.sent"])
    # The event is committed (the outbox row, in the send's own transaction) before any
    # worker runs.
    sent = await client.post(
        "/v1/messages",
        json=email("success@simulator.amazonses.com"),
        headers={**bearer(sender), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert sent.status_code == 201
    receiver.script.append(HANG)  # the first push reaches the receiver and gets no answer

    first = _worker(settings, tls_files[0])
    try:
        (held,) = await asyncio.to_thread(receiver.wait_for, 1, 90.0)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    receiver.release.set()
    async with pg_connection(services.engine) as conn:
        row = await conn.fetchrow(
            "SELECT status, attempts, leased_until FROM webhook_deliveries WHERE event_id = $1",
            held.webhook_id,
        )
    # claimed and leased, never recorded: the dead worker's try left no outcome
    assert row["status"] == "pending" and row["attempts"] == 0
    assert row["leased_until"] is not None

    second = _worker(settings, tls_files[0])
    try:
        requests = await asyncio.to_thread(receiver.wait_for, 2, 90.0)
        await _recorded(services, requests[1].webhook_id)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(30)
        except subprocess.TimeoutExpired:
            second.kill()
    again = requests[1]
    assert again.webhook_id == held.webhook_id and again.body == held.body
    assert again.verified_by == [endpoint["secret"]]
    assert again.event["type"] == "delivery.sent"
    async with pg_connection(services.engine) as conn:
        row = await conn.fetchrow(
            "SELECT status, attempts FROM webhook_deliveries WHERE event_id = $1",
            held.webhook_id,
        )
    assert row["status"] == "delivered" and row["attempts"] == 1
