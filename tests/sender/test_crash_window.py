"""The crash window: the provider accepted, the process died before recording it.

A real `gateway serve` process sends an SMS through the real twilio client; the Twilio stub
accepts the message and then kills that process (SIGKILL) before answering, so the step that
records the outcome never runs. After the "restart" (services built afresh on the same
database): the sweeper turns the stale `in_progress` attempt into `unknown`, a duplicate
request gets 409 (the first one never finished), a status callback carrying the delivery id
(as the signed callback URL does) settles it as sent, and Twilio was called exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from twilio.request_validator import RequestValidator

from gateway.settings import Settings
from retry.sweeper import sweep_stale
from sender.models import Attempt, Delivery, Message
from tests.conftest import gateway_env
from tests.sender.helpers import SMS_FROM, provider_settings, sms
from tests.stubs._server import Behavior
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering


@pytest.fixture
def serve(
    settings: Settings, twilio_stub: TwilioStub, tmp_path: Path
) -> Iterator[Callable[[], tuple[subprocess.Popen[bytes], int]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[subprocess.Popen[bytes], int]:
        assert settings.database_url and settings.redis_url
        port = free_port()
        env = clean_env(
            **gateway_env(
                settings.database_url,
                settings.redis_url,
                GATEWAY_REDIS_PREFIX=settings.redis_prefix,
                GATEWAY_PUBLIC_URL="https://gateway.test",
                GATEWAY_SMS_PROVIDER="twilio",
                GATEWAY_TWILIO_ACCOUNT_SID=ACCOUNT_SID,
                GATEWAY_TWILIO_AUTH_TOKEN=AUTH_TOKEN,
                GATEWAY_SMS_FROM=SMS_FROM,
                GATEWAY_TWILIO_API_BASE=twilio_stub.url,
                GATEWAY_WORKER_ENABLED="false",
                GATEWAY_DATA_DIR=str(tmp_path / "data"),
            )
        )
        proc = subprocess.Popen(
            [GATEWAY, "serve", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        wait_answering(proc, port, "/healthz", timeout=60)
        return proc, port

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_provider_accepted_then_the_process_died(
    settings: Settings,
    twilio_stub: TwilioStub,
    serve: Callable[[], tuple[subprocess.Popen[bytes], int]],
    make_gateway: Callable[..., Any],
) -> None:
    proc, port = await asyncio.to_thread(serve)

    def kill_the_sender() -> None:
        # Twilio has created the message; the sender dies before it hears so.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    twilio_stub.then(Behavior.accept(after_accept=kill_the_sender))
    restarted = provider_settings(settings, twilio_api_base=twilio_stub.url)
    async with make_gateway(restarted) as gw_:
        body = sms("+14155552671")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            with pytest.raises(httpx.HTTPError) as info:
                await http.post(
                    "/v1/messages",
                    json=body,
                    headers={**gw_.headers, "Idempotency-Key": '"crash-1"'},
                    timeout=30,
                )
        assert proc.wait(timeout=10) == -signal.SIGKILL, info.value
        assert twilio_stub.count == 1 and len(twilio_stub.accepted) == 1
        sid = twilio_stub.accepted[0]["sid"]

        async with gw_.services.sessions() as session:
            message = await session.scalar(select(Message))
            row = await session.scalar(select(Delivery))
            [attempt] = (await session.scalars(select(Attempt))).all()
        assert message is not None and message.state == "in_progress"
        assert row is not None and row.status == "sending" and row.provider_message_id is None
        assert attempt.status == "in_progress"  # the outcome was never recorded

        # After the restart: the sweeper resolves the stale attempt as unknown.
        swept = await sweep_stale(
            gw_.services.engine,
            gw_.services.delivery_queue,
            older_than_seconds=0,
            settle_seconds=settings.retry.unknown_settle_seconds,
        )
        assert swept >= 1
        async with gw_.services.sessions() as session:
            row = await session.get(Delivery, row.id)
            attempt = await session.get(Attempt, attempt.id)
        assert row is not None and row.status == "unknown" and row.next_attempt_at is not None
        assert attempt is not None and attempt.status == "unknown"

        # The client retries: the first request never finished, so it is still "in flight".
        dup = await gw_.send(body, key="crash-1")
        assert dup.status_code == 409

        # Twilio's status callback carries the delivery id in its signed URL: it settles it.
        url = f"https://gateway.test/webhooks/twilio/status?d={row.id}"
        params = {
            "MessageSid": sid,
            "SmsSid": sid,
            "AccountSid": ACCOUNT_SID,
            "From": SMS_FROM,
            "To": "+14155552671",
            "MessageStatus": "sent",
            "SmsStatus": "sent",
            "ApiVersion": "2010-04-01",
        }
        signature = RequestValidator(AUTH_TOKEN).compute_signature(url, params)
        callback = await gw_.client.post(
            f"/webhooks/twilio/status?d={row.id}",
            data=params,
            headers={
                "X-Twilio-Signature": signature,
                "I-Twilio-Idempotency-Token": str(uuid.uuid4()),
            },
        )
        assert callback.status_code == 200, callback.text

        async with gw_.services.sessions() as session:
            row = await session.get(Delivery, row.id)
            attempt = await session.get(Attempt, attempt.id)
        assert row is not None and row.status == "sent" and row.provider_message_id == sid
        assert attempt is not None and attempt.status == "accepted"
        assert attempt.provider_message_id == sid

        # Nothing sends it again: not the worker's dispatch, not the client's retry.
        assert await gw_.services.dispatch(row.id) == "sent"
        assert twilio_stub.count == 1
