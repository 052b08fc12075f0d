"""The composition root's object graph: engine, sessions, crypto, Redis and per-package services.

`build_services` is the only place that picks concrete adapters. Everything the HTTP app and
the worker need is reachable from one `Services` instance, which lives on `app.state`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from litestar import Request
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.db import create_engine, session_factory
from gateway.keycache import KeyCache, database_lookup
from gateway.settings import Settings
from retry.breaker import breaker_readiness, build_breaker
from retry.ratelimit import build_limiter
from sender.dispatch import Dispatcher, SenderConfig
from sender.providers.base import Provider
from sender.providers.sandbox import FeedbackRunner, SandboxEmailProvider, SandboxSmsProvider
from sender.providers.ses import SesProvider
from sender.providers.twilio import TwilioProvider
from sender.service import SendService
from suppression.api import SuppressionContext
from suppression.crypto import AddressProtector
from webhooks.api import readiness as webhooks_readiness
from webhooks.certs import CertificateStore
from webhooks.ingest import FeedbackIngestor
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
    # API keys by secret hash, cached for a few seconds (what the auth guard asks).
    api_keys: KeyCache = field(init=False)

    def __post_init__(self) -> None:
        self.api_keys = KeyCache(
            database_lookup(self.engine), ttl=self.settings.api_key_cache_seconds
        )

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
    # retry: rate limiter and circuit breaker, shared through Redis when configured.
    services.extra["limiter"] = build_limiter(
        settings.retry, redis=redis, prefix=settings.redis_prefix
    )
    breaker = build_breaker(settings.retry, redis=redis, prefix=settings.redis_prefix)
    services.extra["breaker"] = breaker
    # The sandbox adapters use the real providers' names, so these two cover every setup.
    services.readiness["breaker"] = breaker_readiness(breaker, ("ses", "twilio"))
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
    # webhooks: feedback processing (the endpoints and the sandbox providers' callbacks).
    services.extra["ingestor"] = FeedbackIngestor(
        services.engine,
        services.protector,
        settings.webhooks,
        retry=settings.retry,
        default_region=settings.default_region,
        on_account_problem=_account_problem(services),
    )
    services.readiness["webhooks"] = webhooks_readiness(services.extra)
    # sender: provider adapters (sandbox by default), the dispatcher and the send API. The
    # retry worker gets `dispatch`; the sandbox's feedback runner gets the webhooks' ingestor.
    send_service, feedback_runner = _build_sender(settings, services)
    services.extra["sender"] = send_service
    services.extra["dispatch"] = send_service.dispatcher.dispatch
    services.extra["sandbox_feedback"] = feedback_runner
    services.closers.append(send_service.close)
    # suppression: what its routes need (protector, sessions for streaming, caller naming).
    services.extra["suppression"] = SuppressionContext(
        protector=services.protector,
        sessions=services.sessions,
        default_region=settings.default_region,
        actor_of=_actor_of,
    )
    return services


def _build_sender(settings: Settings, services: Services) -> tuple[SendService, FeedbackRunner]:
    """The send side: one adapter per channel, the dispatcher and the send service."""
    # The webhooks' ingestor (when built) receives the sandbox's simulated callbacks and is
    # told when a send recorded a provider id / an unknown outcome (parked callbacks).
    ingestor = services.extra.get("ingestor")
    runner = FeedbackRunner(ingestor, delay=settings.sandbox_feedback_delay_seconds)
    connect = settings.provider_connect_timeout_seconds
    read = settings.provider_read_timeout_seconds
    email: Provider
    if settings.email_provider == "ses":
        email = SesProvider(
            region=settings.aws_region,
            configuration_set=settings.ses_configuration_set,
            max_attempts=settings.ses_max_attempts,
            connect_timeout=connect,
            read_timeout=read,
        )
    else:
        email = SandboxEmailProvider(runner, configuration_set=settings.ses_configuration_set)
    sms: Provider
    if settings.sms_provider == "twilio":
        assert settings.twilio_account_sid and settings.twilio_auth_tokens
        sms = TwilioProvider(
            account_sid=settings.twilio_account_sid,
            auth_token=settings.twilio_auth_tokens[0],
            public_url=settings.public_url,
            sms_from=settings.sms_from,
            messaging_service_sid=settings.twilio_messaging_service_sid,
            api_base=settings.twilio_api_base,
            connect_timeout=connect,
            read_timeout=read,
        )
    else:
        sms = SandboxSmsProvider(
            runner,
            public_url=settings.public_url,
            sms_from=settings.sms_from,
            messaging_service_sid=settings.twilio_messaging_service_sid,
        )
    config = SenderConfig(
        public_url=settings.public_url,
        default_region=settings.default_region,
        email_from=settings.email_from,
        sms_from=settings.sms_from,
        retry=settings.retry,
        error_overrides=settings.send_error_overrides,
        concurrency=settings.send_concurrency,
        unsubscribe_mailto=settings.unsubscribe_mailto,
    )
    dispatcher = Dispatcher(
        sessions=services.sessions,
        protector=services.protector,
        providers={"email": email, "sms": sms},
        config=config,
        limiter=services.extra.get("limiter"),
        breaker=services.extra.get("breaker"),
        on_provider_id=ingestor.apply_parked if ingestor else None,
        on_unknown_outcome=ingestor.apply_parked_for_delivery if ingestor else None,
    )
    return SendService(dispatcher), runner


def _account_problem(services: Services) -> Callable[[str, str], Awaitable[None]]:
    """Feedback reported an account-level problem: tell the provider's circuit breaker."""

    async def flag(provider: str, rule: str) -> None:
        breaker = services.extra.get("breaker")
        if breaker is not None:
            await breaker.record_failure(provider, account_level=True)

    return flag


def _actor_of(request: Request[Any, Any, Any]) -> str:
    """How an authenticated caller is named in suppression history."""
    from gateway.auth import principal_of  # gateway.auth imports this module

    return f"api_key:{principal_of(request).key_id}"
