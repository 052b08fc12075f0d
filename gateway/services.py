"""The composition root's object graph: engine, sessions, crypto, Redis and per-package services.

`build_services` is the only place that picks concrete adapters. Everything the HTTP app and
the worker need is reachable from one `Services` instance, which lives on `app.state`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.db import create_engine, session_factory
from gateway.settings import Settings
from suppression.crypto import AddressProtector
from webhooks.certs import CertificateStore
from webhooks.sns import SnsVerifier
from webhooks.twilio_signature import TwilioVerifier

log = logging.getLogger("gateway")

ReadinessCheck = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


@dataclass
class Services:
    """Everything the app and the worker share; built once per process."""

    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    protector: AddressProtector
    redis: Redis | None = None
    # name -> check returning (ready, details); /readyz runs them all.
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)
    # Coroutines to run when the process shuts down.
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # Per-package services, keyed by package name (filled by build_services).
    extra: dict[str, Any] = field(default_factory=dict)

    async def close(self) -> None:
        """Release every resource (closers first, then Redis and the engine)."""
        for closer in reversed(self.closers):
            try:
                await closer()
            except Exception:  # pragma: no cover - best effort on shutdown
                log.exception("error while closing")
        if self.redis is not None:
            await self.redis.aclose()
        await self.engine.dispose()


def build_services(settings: Settings, database_url: str) -> Services:
    """Wire the concrete adapters for `settings` (secrets must already be resolved)."""
    engine = create_engine(database_url)
    redis = Redis.from_url(settings.redis_url) if settings.redis_url else None
    services = Services(
        settings=settings,
        engine=engine,
        sessions=session_factory(engine),
        protector=AddressProtector(settings.hash_key, settings.secret_keys),
        redis=redis,
    )
    # webhooks: signature verification. The SNS certificate cache is shared through Redis
    # when configured; empty allow-list / no token means the verifier refuses everything.
    cert_store = CertificateStore(redis=redis, redis_prefix=settings.redis_prefix)
    services.extra["cert_store"] = cert_store
    services.extra["sns_verifier"] = SnsVerifier(
        allowed_topic_arns=settings.sns_topic_arns,
        certs=cert_store,
        max_age_seconds=settings.sns_max_age_seconds,
    )
    services.extra["twilio_verifier"] = TwilioVerifier(
        auth_tokens=settings.twilio_auth_tokens,
        subaccount_tokens=settings.twilio_subaccount_tokens,
    )
    return services
