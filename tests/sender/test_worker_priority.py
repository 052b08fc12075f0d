"""Priority that holds, with the real worker, the real dispatch and the real Twilio client
against the local stub.

* A `high` delivery accepted (respond-async) after 50,000 `low` ones, while the `low` lane's
  calls hang at the provider, still reaches the provider: the lanes keep slots for it.
* Two `gateway worker` processes on one backlog send each delivery exactly once (counted at
  the stub).

Backlogs are created set-based in SQL (`tests.retry.helpers.insert_deliveries`) and given
real ciphertexts, so the dispatch decrypts and sends them like any other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import func, select, text

from gateway.services import Services
from gateway.settings import Settings
from gateway.worker import build_worker
from sender.models import Delivery
from tests.conftest import gateway_env
from tests.retry.helpers import insert_deliveries
from tests.sender.helpers import SMS_FROM, Gateway, delivery, provider_settings, sms
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub

GATEWAY = str(Path(sys.executable).with_name("gateway"))
LOW = "+14155550100"
HIGH = "+14155550199"


async def seed(
    services: Services, n: int, *, priority: str, numbers: Sequence[str]
) -> list[uuid.UUID]:
    """`n` queued SMS deliveries due now, recipients cycling through `numbers`."""
    protector = services.protector
    content = protector.encrypt(json.dumps({"body": "Sale today", "from": None}))
    encrypted = {number: protector.encrypt(number) for number in numbers}
    hashes = {number: protector.hash("sms", number) for number in numbers}
    async with services.sessions() as s, s.begin():
        ids = await insert_deliveries(
            s, n, channel="sms", priority=priority, status="queued", category="marketing"
        )
        chosen = [numbers[i % len(numbers)] for i in range(n)]
        await s.execute(
            text(
                "UPDATE deliveries d SET recipient_encrypted = u.enc, recipient_hash = u.hash "
                "FROM unnest(CAST(:ids AS uuid[]), CAST(:encs AS text[]), "
                "CAST(:hashes AS text[])) AS u(id, enc, hash) WHERE d.id = u.id"
            ),
            {
                "ids": ids,
                "encs": [encrypted[c] for c in chosen],
                "hashes": [hashes[c] for c in chosen],
            },
        )
        await s.execute(
            text(
                "UPDATE messages SET content_encrypted = :c WHERE id IN "
                "(SELECT message_id FROM deliveries WHERE id = ANY(CAST(:ids AS uuid[])))"
            ),
            {"c": content, "ids": ids},
        )
    return ids


async def wait_for(check: Callable[[], bool], what: str, *, seconds: float = 60.0) -> None:
    """Wait until `check()` holds (a guard against hanging, not a timing assertion)."""
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


async def test_high_after_50000_low_is_sent_while_the_low_lane_is_stuck(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    concurrency = 4
    configured = provider_settings(
        settings,
        twilio_api_base=twilio_stub.url,
        provider_read_timeout_seconds=60.0,
    )
    configured = dataclasses.replace(
        configured,
        retry=dataclasses.replace(
            configured.retry, worker_concurrency=concurrency, worker_batch=50
        ),
    )
    hold = threading.Event()
    # Every low call hangs at the provider until released: the low lane's slots fill up.
    twilio_stub.by_recipient[LOW] = Behavior.accept(hold=hold)
    async with make_gateway(configured) as gw:
        await seed(gw.services, 50_000, priority="low", numbers=[LOW])
        task = asyncio.create_task(build_worker(gw.services).run())
        try:
            await wait_for(
                lambda: len(twilio_stub.calls_to(LOW)) >= concurrency, "the low lane is busy"
            )
            r = await gw.send(sms(HIGH, priority="high"), headers={"Prefer": "respond-async"})
            assert r.status_code == 202
            await wait_for(lambda: len(twilio_stub.calls_to(HIGH)) == 1, "the high call")
            # Only the low lane's own slots held low calls; the other 49,996 wait.
            assert len(twilio_stub.calls_to(LOW)) == concurrency
            high_id = r.json()["deliveries"][0]["id"]

            async def status() -> str:
                return (await delivery(gw.services, high_id)).status

            for _ in range(1500):
                if await status() == "sent":
                    break
                await asyncio.sleep(0.02)
            assert await status() == "sent"
        finally:
            hold.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_two_worker_processes_send_each_delivery_once(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    n = 1200
    numbers = [f"+1415556{i:04d}" for i in range(n)]
    async with make_gateway(provider_settings(settings, twilio_api_base=twilio_stub.url)) as gw:
        await seed(gw.services, n // 2, priority="low", numbers=numbers[: n // 2])
        await seed(gw.services, n // 2, priority="normal", numbers=numbers[n // 2 :])
        assert settings.database_url is not None
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
            **gateway_env(
                settings.database_url,
                settings.redis_url,
                GATEWAY_REDIS_PREFIX=settings.redis_prefix,
                GATEWAY_SMS_PROVIDER="twilio",
                GATEWAY_TWILIO_ACCOUNT_SID=ACCOUNT_SID,
                GATEWAY_TWILIO_AUTH_TOKEN=AUTH_TOKEN,
                GATEWAY_TWILIO_API_BASE=twilio_stub.url,
                GATEWAY_SMS_FROM=SMS_FROM,
                GATEWAY_RATE_LIMITS="twilio:*=100000",
                GATEWAY_WORKER_BATCH="20",
                GATEWAY_WORKER_CONCURRENCY="4",
            ),
        }
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
        errors: list[str] = []
        try:

            async def sent() -> int:
                async with gw.services.sessions() as s:
                    value = await s.scalar(
                        select(func.count()).select_from(Delivery).where(Delivery.status == "sent")
                    )
                return int(value or 0)

            for _ in range(3000):  # a guard against hanging, not a timing assertion
                if await sent() == n or any(p.returncode is not None for p in procs):
                    break
                await asyncio.sleep(0.05)
            done = await sent()
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                _, err = await asyncio.wait_for(proc.communicate(), 60)
                errors.append(err.decode())
        assert done == n, errors
        assert all(p.returncode == 0 for p in procs), errors
    per_recipient = collections.Counter(c.recipient for c in twilio_stub.calls)
    assert sorted(per_recipient) == sorted(numbers)
    assert set(per_recipient.values()) == {1}
    # Both processes ran the worker over the whole backlog.
    assert all("retry worker running" in e for e in errors)


async def test_async_acceptance_wakes_a_worker_process_that_does_not_poll(
    settings: Settings,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    # The worker process polls once an hour: only the NOTIFY of the accepting process (this
    # one) can make it claim the accepted delivery while the test runs.
    async with make_gateway(provider_settings(settings, twilio_api_base=twilio_stub.url)) as gw:
        assert settings.database_url is not None
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
            **gateway_env(
                settings.database_url,
                settings.redis_url,
                GATEWAY_REDIS_PREFIX=settings.redis_prefix,
                GATEWAY_SMS_PROVIDER="twilio",
                GATEWAY_TWILIO_ACCOUNT_SID=ACCOUNT_SID,
                GATEWAY_TWILIO_AUTH_TOKEN=AUTH_TOKEN,
                GATEWAY_TWILIO_API_BASE=twilio_stub.url,
                GATEWAY_SMS_FROM=SMS_FROM,
                GATEWAY_RATE_LIMITS="twilio:*=100000",
                GATEWAY_WORKER_POLL_SECONDS="3600",
            ),
        }
        proc = await asyncio.create_subprocess_exec(
            GATEWAY,
            "worker",
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        err = b""
        try:

            async def listening() -> bool:
                async with gw.services.sessions() as s:
                    found = await s.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND query LIKE 'LISTEN%gateway_deliveries_due%'"
                        )
                    )
                return bool(found)

            for _ in range(1500):  # a guard against hanging, not a timing assertion
                if await listening() or proc.returncode is not None:
                    break
                await asyncio.sleep(0.02)
            assert await listening(), proc.returncode
            # The lanes' first claims (at start) found nothing; from now on only a wake-up
            # makes them claim again.
            await asyncio.sleep(0.5)
            ids = []
            for i in range(3):  # a NOTIFY sent before LISTEN took effect would be lost
                r = await gw.send(
                    sms(f"+1415557000{i}", priority="high"), headers={"Prefer": "respond-async"}
                )
                assert r.status_code == 202
                ids.append(r.json()["deliveries"][0]["id"])
                for _ in range(250):
                    if twilio_stub.count:
                        break
                    await asyncio.sleep(0.02)
                if twilio_stub.count:
                    break
            for _ in range(1500):
                statuses = [(await delivery(gw.services, d)).status for d in ids]
                if set(statuses) == {"sent"}:
                    break
                await asyncio.sleep(0.02)
            assert set(statuses) == {"sent"}
            assert sorted(c.recipient or "" for c in twilio_stub.calls) == [
                f"+1415557000{i}" for i in range(len(ids))
            ]
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
