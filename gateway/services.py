"""The composition root's object graph: engine, sessions, crypto, Redis and per-package services.

`build_services` is the only place that picks concrete adapters. Everything the HTTP app and
the worker need is reachable from one `Services` instance, which lives on `app.state`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from litestar import Request
from redis.asyncio import BlockingConnectionPool, Redis
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gateway.db import create_engine, session_factory
from gateway.keycache import KeyCache, database_lookup
from gateway.outbound import Outbound, build_outbound
from gateway.providers import PROVIDERS, Registration, activate, send_spec
from gateway.settings import Settings
from retry.breaker import CircuitBreaker, breaker_readiness, build_breaker
from retry.queue import DeliveryQueue
from retry.ratelimit import RateLimiter, build_limiter
from retry.shared import SharedStateOutage, SharedStateUnavailable
from retry.wakeup import Wakeup
from retry.worker import Dispatch
from sender import log as delivery_log
from sender.campaigns import CampaignService
from sender.dispatch import Dispatcher, SenderConfig
from sender.mailbox import Mailbox
from sender.mailbox_api import MailboxContext
from sender.providers.base import Provider
from sender.providers.sandbox import FeedbackRunner, SandboxEmailProvider, SandboxSmsProvider
from sender.providers.spec import ProviderContext
from sender.reputation import ReputationGuard, uncounted_hashes
from sender.service import SendService
from suppression.api import SuppressionContext
from suppression.crypto import AddressProtector
from webhooks.api import readiness as webhooks_readiness
from webhooks.certs import CertificateStore
from webhooks.history import events_for_deliveries
from webhooks.ingest import FeedbackIngestor
from webhooks.outbound.endpoints import Endpoints
from webhooks.sns import SnsVerifier
from webhooks.twilio_signature import TwilioVerifier

log = logging.getLogger("gateway")

# Seconds a Redis command or connect may take before it counts as an outage.
REDIS_TIMEOUT_SECONDS = 2.0

ReadinessCheck = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


@dataclass
class Services:
    """Everything the app and the worker share; built once per process, every field wired
    by `build_services` (a missing wire fails there, at start, not at the first request)."""

    settings: Settings
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    protector: AddressProtector
    redis: Redis | None
    limiter: RateLimiter
    breaker: CircuitBreaker
    cert_store: CertificateStore
    sns_verifier: SnsVerifier
    twilio_verifier: TwilioVerifier
    ingestor: FeedbackIngestor
    sender: SendService
    sandbox_feedback: FeedbackRunner
    suppression: SuppressionContext
    # The delivery log's operations for the retry package (`sender.log` implements them).
    delivery_queue: DeliveryQueue
    # Wakes the retry worker's lanes when deliveries were queued due now (retry.wakeup).
    wakeup: Wakeup
    # Campaigns (bulk sends): the API's service and the expansion job.
    campaigns: CampaignService
    # Outbound webhooks: push client, pusher, endpoint operations, event feed adapter.
    outbound: Outbound
    # The reputation guard: the send path's view of paused identities, the worker's
    # evaluation, `GET /v1/reputation` and the metrics (`reputation.current()`).
    reputation: ReputationGuard
    # The sandbox mailbox's store and channels; None when no provider is the sandbox.
    sandbox_mailbox: MailboxContext | None = None
    # httpx transport for SNS SubscribeURL confirmations (tests inject one); None = network.
    sns_confirm_transport: httpx.AsyncBaseTransport | None = None
    # name -> check returning (ready, details); /readyz runs them all.
    readiness: dict[str, ReadinessCheck] = field(default_factory=dict)
    # Coroutines to run when the process shuts down.
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # The registered providers (gateway/providers.py): their routes are the app's.
    providers: tuple[Registration, ...] = PROVIDERS
    # Verifiers of registered providers' webhooks, by provider name (`webhooks.spec`).
    feedback_verifiers: dict[str, Any] = field(default_factory=dict)
    # API keys by secret hash, cached for a few seconds (what the auth guard asks).
    api_keys: KeyCache = field(init=False)

    def __post_init__(self) -> None:
        self.api_keys = KeyCache(
            database_lookup(self.engine), ttl=self.settings.api_key_cache_seconds
        )

    @property
    def webhook_endpoints(self) -> Endpoints:
        """The outbound endpoints' operations (what `/v1/webhook-endpoints` uses)."""
        return self.outbound.endpoints

    @property
    def dispatch(self) -> Dispatch:
        """The send path's dispatch of one delivery (handed to the retry worker)."""
        return self.sender.dispatcher.dispatch

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


def build_services(
    settings: Settings, database_url: str, providers: Sequence[Registration] = PROVIDERS
) -> Services:
    """Wire the concrete adapters for `settings` (secrets must already be resolved) and the
    `providers` (gateway/providers.py; tests may add one)."""
    providers = tuple(providers)
    activate(providers)
    context = _provider_context(settings)
    engine = create_engine(database_url, pool_size=settings.db_pool_size)
    redis = _redis(settings.redis_url) if settings.redis_url else None
    sessions = session_factory(engine)
    protector = AddressProtector(settings.hash_key, settings.secret_keys)
    # retry: rate limiter and circuit breaker, shared through Redis when configured.
    # One outage tracker for both: "Redis is down" is logged once, not once per component.
    outage = SharedStateOutage()
    limiter = build_limiter(
        settings.retry, redis=redis, prefix=settings.redis_prefix, outage=outage
    )
    breaker = build_breaker(
        settings.retry, redis=redis, prefix=settings.redis_prefix, outage=outage
    )
    # webhooks: signature verification. The SNS certificate cache is shared through Redis
    # when configured; empty allow-list / no token means the verifier refuses everything.
    cert_store = CertificateStore(redis=redis, redis_prefix=settings.redis_prefix)

    async def account_problem(provider: str, rule: str) -> None:
        # Feedback reported an account-level problem: tell the provider's circuit breaker.
        # (With Redis down the feedback is still stored; the outage is logged once.)
        with contextlib.suppress(SharedStateUnavailable):
            await breaker.record_failure(provider, account_level=True)

    # webhooks: feedback processing (the endpoints and the sandbox providers' callbacks).
    ingestor = FeedbackIngestor(
        engine,
        protector,
        settings.webhooks,
        retry=settings.retry,
        default_region=settings.default_region,
        on_account_problem=account_problem,
    )
    # sender: provider adapters (sandbox by default), the dispatcher and the send API; the
    # sandbox's feedback runner gets the webhooks' ingestor.
    # Its records (the mailbox) and callback progress are written by `sender.mailbox`, so
    # pending callbacks survive a restart (`replay_sandbox_feedback`).
    sandbox_channels = tuple(
        channel
        for channel, provider in (
            ("email", settings.email_provider),
            ("sms", settings.sms_provider),
        )
        if provider == "sandbox"
    )
    mailbox = Mailbox(engine, protector, default_region=settings.default_region)
    runner = FeedbackRunner(
        ingestor,
        delay=settings.sandbox_feedback_delay_seconds,
        store=mailbox if sandbox_channels else None,
    )
    reputation = ReputationGuard(engine, settings.reputation, uncounted=uncounted_hashes(protector))
    dispatcher = Dispatcher(
        engine=engine,
        protector=protector,
        providers=_providers(settings, runner, providers, context),
        config=_sender_config(settings),
        limiter=limiter,
        breaker=breaker,
        on_parked=ingestor.apply_parked_for_delivery,
        on_unknown_outcome=ingestor.apply_parked_for_delivery,
        reputation=reputation,
    )
    # retry: wakes this process's worker lanes (and, by NOTIFY, other processes') when an
    # asynchronous acceptance queued deliveries due now.
    wakeup = Wakeup(engine)
    send_service = SendService(
        dispatcher, sessions, events_of=events_for_deliveries, on_queued=wakeup.notify
    )
    # webhooks.outbound: signed pushes of the event feed to upstream endpoints.
    outbound = build_outbound(settings, engine, protector)
    services = Services(
        settings=settings,
        engine=engine,
        sessions=sessions,
        protector=protector,
        redis=redis,
        limiter=limiter,
        breaker=breaker,
        cert_store=cert_store,
        sns_verifier=SnsVerifier(
            allowed_topic_arns=settings.sns_topic_arns,
            certs=cert_store,
            max_age_seconds=settings.sns_max_age_seconds,
        ),
        twilio_verifier=TwilioVerifier(
            auth_tokens=settings.twilio_auth_tokens,
            subaccount_tokens=settings.twilio_subaccount_tokens,
        ),
        ingestor=ingestor,
        sender=send_service,
        sandbox_feedback=runner,
        # suppression: what its routes need (protector, sessions for streaming, naming).
        suppression=SuppressionContext(
            protector=protector,
            sessions=sessions,
            default_region=settings.default_region,
            actor_of=_actor_of,
        ),
        delivery_queue=delivery_log,
        wakeup=wakeup,
        campaigns=CampaignService(send_service, batch=settings.campaign_batch),
        providers=providers,
        feedback_verifiers={
            r.feedback.name: r.feedback.build_verifier(context)
            for r in providers
            if r.feedback is not None and r.feedback.build_verifier is not None
        },
        outbound=outbound,
        reputation=reputation,
        sandbox_mailbox=(
            MailboxContext(mailbox, runner, sandbox_channels) if sandbox_channels else None
        ),
    )
    # The sandbox adapters use the real providers' names, so these cover every setup.
    services.readiness["breaker"] = breaker_readiness(breaker, tuple(r.name for r in providers))
    services.readiness["webhooks"] = webhooks_readiness(
        {
            "sns_verifier": services.sns_verifier,
            "twilio_verifier": services.twilio_verifier,
            "verifiers": services.feedback_verifiers,
        }
    )
    services.closers.append(send_service.close)
    services.closers.append(outbound.client.close)
    services.closers.append(reputation.close)
    return services


REDIS_MAX_CONNECTIONS = 100
REDIS_POOL_TIMEOUT_SECONDS = 5.0


def _redis(url: str) -> Redis:
    """A Redis client whose pool makes a burst wait for a free connection (up to
    REDIS_POOL_TIMEOUT_SECONDS) instead of failing: redis-py's default pool raises
    "Too many connections" beyond 100 at once, which 200 concurrent sends reached."""
    # Bounded socket waits: a Redis that hangs must defer sends (retry.shared), not hang them.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=REDIS_POOL_TIMEOUT_SECONDS,
        socket_timeout=REDIS_TIMEOUT_SECONDS,
        socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
    )
    return Redis.from_pool(pool)


async def replay_sandbox_feedback(services: Services) -> None:
    """Schedule the sandbox's stored callbacks that were still pending when a process died
    or stopped (a background task of every serving process; no-op without the sandbox)."""
    if services.sandbox_mailbox is not None:
        await services.sandbox_feedback.replay()


def _provider_context(settings: Settings) -> ProviderContext:
    return ProviderContext(
        settings=settings,
        env=settings.provider_env,
        public_url=settings.public_url,
        connect_timeout=settings.provider_connect_timeout_seconds,
        read_timeout=settings.provider_read_timeout_seconds,
    )


def _providers(
    settings: Settings,
    runner: FeedbackRunner,
    providers: Sequence[Registration],
    context: ProviderContext,
) -> dict[str, Provider]:
    """One send adapter per channel: the sandbox unless a registered provider is chosen."""
    chosen: dict[str, Provider] = {}
    for channel, name in (("email", settings.email_provider), ("sms", settings.sms_provider)):
        spec = send_spec(name, channel, providers)
        if spec is not None:
            chosen[channel] = spec.build(context)
        elif name != "sandbox":
            raise ValueError(f"no {channel} provider named {name!r} is registered")
        elif channel == "email":
            chosen[channel] = SandboxEmailProvider(
                runner, configuration_set=settings.ses_configuration_set
            )
        else:
            chosen[channel] = SandboxSmsProvider(
                runner,
                public_url=settings.public_url,
                sms_from=settings.sms_from,
                messaging_service_sid=settings.twilio_messaging_service_sid,
            )
    return chosen


def _sender_config(settings: Settings) -> SenderConfig:
    return SenderConfig(
        public_url=settings.public_url,
        default_region=settings.default_region,
        email_from=settings.email_from,
        sms_from=settings.sms_from,
        sms_service=settings.twilio_messaging_service_sid,
        retry=settings.retry,
        error_overrides=settings.send_error_overrides,
        concurrency=settings.send_concurrency,
        unsubscribe_mailto=settings.unsubscribe_mailto,
        marketing_async=settings.marketing_async,
    )


def _actor_of(request: Request[Any, Any, Any]) -> str:
    """How an authenticated caller is named in suppression history."""
    from gateway.auth import principal_of  # gateway.auth imports this module

    return f"api_key:{principal_of(request).key_id}"
