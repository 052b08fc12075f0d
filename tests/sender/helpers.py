"""Helpers of the send-path tests: settings for real adapters, a gateway handle, row access."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import httpx
from sqlalchemy import func, select

from gateway.keys import create_key
from gateway.services import Services
from gateway.settings import Settings
from sender.models import Attempt, Delivery, Message
from suppression import service as suppression
from suppression.models import Suppression
from suppression.normalize import normalize
from tests.conftest import replace_settings
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN

SMS_FROM = "+15017122661"


def provider_settings(settings: Settings, **changes: Any) -> Settings:
    """Settings for a gateway on real adapters (SES, Twilio) with generous rate limits."""
    retry = dataclasses.replace(
        settings.retry,
        rate_limits={},
        unknown_settle_seconds=300.0,
        max_attempts=3,
    )
    base: dict[str, Any] = {
        "email_provider": "ses",
        "sms_provider": "twilio",
        "aws_region": "us-east-1",
        "twilio_account_sid": ACCOUNT_SID,
        "twilio_auth_tokens": (AUTH_TOKEN,),
        "sms_from": SMS_FROM,
        "retry": retry,
        "provider_connect_timeout_seconds": 5.0,
        "provider_read_timeout_seconds": 10.0,
        "ses_configuration_set": "gateway-events",
        "email_from": "sender@example.com",
    }
    base.update(changes)
    return replace_settings(settings, **base)


@dataclasses.dataclass
class Gateway:
    """A gateway built for one test: its services and an HTTP client on its app."""

    services: Services
    client: httpx.AsyncClient
    secret: str

    async def make_key(self, *scopes: str) -> str:
        """Create an API key with these scopes; returns its secret."""
        async with self.services.sessions() as session:
            _, secret = await create_key(session, list(scopes), name="test")
            await session.commit()
        return secret

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}

    async def send(self, body: dict[str, Any], key: str | None = None, **kw: Any) -> httpx.Response:
        """POST /v1/messages with a fresh (or the given) Idempotency-Key."""
        headers = {**self.headers, "Idempotency-Key": f'"{key or uuid.uuid4()}"'}
        headers.update(kw.pop("headers", {}))
        return await self.client.post("/v1/messages", json=body, headers=headers, **kw)


async def count_rows(services: Services) -> dict[str, int]:
    """How many messages, deliveries and attempts exist."""
    async with services.sessions() as session:
        return {
            model.__tablename__: int(
                await session.scalar(select(func.count()).select_from(model)) or 0
            )
            for model in (Message, Delivery, Attempt)
        }


async def delivery(services: Services, delivery_id: str | uuid.UUID) -> Delivery:
    """A delivery row as stored now."""
    async with services.sessions() as session:
        row = await session.get(Delivery, uuid.UUID(str(delivery_id)))
        assert row is not None
        return row


async def attempts_of(services: Services, delivery_id: str | uuid.UUID) -> list[Attempt]:
    """The attempts of a delivery, in order."""
    async with services.sessions() as session:
        rows = await session.scalars(
            select(Attempt)
            .where(Attempt.delivery_id == uuid.UUID(str(delivery_id)))
            .order_by(Attempt.number)
        )
        return list(rows)


async def suppress_sms(services: Services, number: str) -> Suppression:
    """Put an SMS number on the suppression list (an `sms_stop`), committed; the entry."""
    async with services.sessions() as session:
        entry, _ = await suppression.add(
            session,
            services.protector,
            normalize("sms", number),
            reason="sms_stop",
            source=suppression.Source(type="test"),
        )
        await session.commit()
    return entry


def email(to: list[str] | str, **extra: Any) -> dict[str, Any]:
    """A minimal valid email send body."""
    body: dict[str, Any] = {
        "channel": "email",
        "to": [to] if isinstance(to, str) else to,
        "subject": "Your code",
        "text": "123456",
    }
    body.update(extra)
    return body


def sms(to: list[str] | str, **extra: Any) -> dict[str, Any]:
    """A minimal valid SMS send body."""
    body: dict[str, Any] = {
        "channel": "sms",
        "to": [to] if isinstance(to, str) else to,
        "body": "Code 123456",
    }
    body.update(extra)
    return body
