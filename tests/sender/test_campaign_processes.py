"""Campaigns across processes, on real PostgreSQL: a SIGKILL during the expansion loses and
duplicates nothing, and two `gateway worker` processes drain one campaign with every
recipient called exactly once at the (Twilio stub) provider."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import Settings
from suppression.db import pg_connection
from tests.conftest import gateway_env
from tests.sender.helpers import SMS_FROM, Gateway, provider_settings, suppress_sms
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub
from tests.support.process import GATEWAY, clean_env

ROOT = Path(__file__).resolve().parents[2]


def numbers(n: int) -> list[str]:
    """`n` distinct valid US numbers."""
    return [f"+1415{5550000 + i:07d}" for i in range(n)]


@pytest.fixture
async def gw(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> AsyncIterator[Gateway]:
    async with make_gateway(
        provider_settings(settings, twilio_api_base=twilio_stub.url), "send", "read"
    ) as g:
        yield g


async def started_campaign(gw: Gateway, recipients: list[str]) -> tuple[str, uuid.UUID]:
    """A started SMS campaign to `recipients`: (campaign id, its message id)."""
    r = await gw.client.post(
        "/v1/campaigns",
        json={"channel": "sms", "body": "Sale", "category": "marketing"},
        headers={**gw.headers, "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    campaign_id = r.json()["id"]
    lines = "".join(json.dumps({"to": n}) + "\n" for n in recipients).encode()
    r = await gw.client.put(
        f"/v1/campaigns/{campaign_id}/recipients",
        content=lines,
        headers={**gw.headers, "Content-Type": "application/x-ndjson"},
    )
    assert r.status_code == 200, r.text
    r = await gw.client.post(f"/v1/campaigns/{campaign_id}/start", headers=gw.headers)
    assert r.status_code == 202, r.text
    view = (await gw.client.get(f"/v1/campaigns/{campaign_id}", headers=gw.headers)).json()
    return campaign_id, uuid.UUID(view["message_id"])


def env_of(settings: Settings, **extra: str) -> dict[str, str]:
    assert settings.database_url and settings.redis_url
    return clean_env(
        **gateway_env(
            settings.database_url,
            settings.redis_url,
            GATEWAY_REDIS_PREFIX=settings.redis_prefix,
            GATEWAY_LOG_LEVEL="WARNING",
            **extra,
        )
    )


async def test_kill_9_during_expansion_resumes_without_duplicates_or_losses(
    gw: Gateway, settings: Settings
) -> None:
    recipients = numbers(600)
    await suppress_sms(gw.services, recipients[7])
    campaign_id, message_id = await started_campaign(gw, recipients)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.sender.expand_campaign",
        "20",
        cwd=ROOT,
        env=env_of(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        for _ in range(5):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert line.startswith(b"batch"), line
        # It goes straight on with the next batch: killed in the middle of the expansion.
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    query = (
        "SELECT count(*) AS n, count(DISTINCT d.position) AS positions, "
        "count(DISTINCT d.recipient_hash) AS hashes, "
        "(SELECT expanded_position FROM campaigns WHERE id = $2) AS cursor "
        "FROM deliveries d WHERE d.message_id = $1"
    )
    async with pg_connection(gw.services.engine) as conn:
        before = await conn.fetchrow(query, message_id, uuid.UUID(campaign_id))
    # Only whole committed batches: exactly the recipients up to the cursor.
    assert 100 <= before["n"] < len(recipients)
    assert before["n"] == before["positions"] == before["hashes"] == before["cursor"] + 1

    # Resume (any process may: here this one).
    while (await gw.services.campaigns.expand_once(batch=50)).campaign_id is not None:
        pass
    async with pg_connection(gw.services.engine) as conn:
        after = await conn.fetchrow(query, message_id, uuid.UUID(campaign_id))
        missing = await conn.fetchval(
            "SELECT count(*) FROM campaign_recipients r WHERE r.campaign_id = $1 AND NOT EXISTS "
            "(SELECT 1 FROM deliveries d WHERE d.message_id = $2 AND d.position = r.position "
            "AND d.derived_key = r.derived_key)",
            uuid.UUID(campaign_id),
            message_id,
        )
    assert after["n"] == after["positions"] == after["hashes"] == len(recipients)
    assert missing == 0
    view = (await gw.client.get(f"/v1/campaigns/{campaign_id}", headers=gw.headers)).json()
    assert view["state"] == "sending"
    assert view["counts"]["suppressed"] == 1
    assert view["counts"]["queued"] == len(recipients) - 1


async def test_two_worker_processes_send_each_delivery_exactly_once(
    gw: Gateway, settings: Settings, twilio_stub: TwilioStub, tmp_path: Path
) -> None:
    recipients = numbers(240)
    campaign_id, _ = await started_campaign(gw, recipients)
    env = env_of(
        settings,
        GATEWAY_SMS_PROVIDER="twilio",
        GATEWAY_TWILIO_ACCOUNT_SID=ACCOUNT_SID,
        GATEWAY_TWILIO_AUTH_TOKEN=AUTH_TOKEN,
        GATEWAY_SMS_FROM=SMS_FROM,
        GATEWAY_TWILIO_API_BASE=twilio_stub.url,
        GATEWAY_PUBLIC_URL="https://gateway.test",
        GATEWAY_RATE_LIMITS="twilio:*=100000",
        GATEWAY_CAMPAIGN_BATCH="15",
        GATEWAY_CAMPAIGN_POLL_SECONDS="0.05",
        GATEWAY_WORKER_POLL_SECONDS="0.05",
        GATEWAY_DB_POOL_SIZE="4",
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
    )
    procs = [
        await asyncio.create_subprocess_exec(
            GATEWAY,
            "worker",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    state: Any = None
    errors: list[str] = []
    try:
        for _ in range(1200):  # a guard against hanging, not a timing assertion
            view = (await gw.client.get(f"/v1/campaigns/{campaign_id}", headers=gw.headers)).json()
            state = view["state"]
            if state == "done" or any(p.returncode is not None for p in procs):
                break
            await asyncio.sleep(0.1)
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                _, err = await asyncio.wait_for(p.communicate(), 30)
                errors.append(err.decode())
            except TimeoutError:
                p.kill()
                await p.wait()
    assert state == "done", "\n".join(errors)[-4000:]
    calls = collections.Counter(call.body["To"] for call in twilio_stub.calls)
    assert set(calls) == set(recipients)
    assert set(calls.values()) == {1}
    assert view["counts"]["sent"] == len(recipients)
