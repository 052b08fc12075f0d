"""The dispatch procedure: provider attempts for deliveries, crash-safe.

The send service makes the first attempt of each delivery inside its claim (see
`sender.service`); `Dispatcher.dispatch(delivery_id)` makes every later one (the retry
worker's path). Both end in `Dispatcher.finish`, which classifies and records outcomes.

`dispatch`:

1. Reads the delivery (no lock) and checks: still dispatchable, not suppressed (re-checked
   every time), not past its deadline, attempt budget left; a settled `unknown` follows the
   unknown-outcome policy (`retry.policy.settle_reason`).
2. Circuit breaker and rate limiter. No token or an open circuit: the delivery is deferred
   (`queued`, near `next_attempt_at`), no attempt is counted, the provider is not called.
3. The attempt row is written `in_progress` and the delivery `sending` in one conditional
   statement (`sender.log.begin_attempt`): it only succeeds when nobody changed the delivery
   since step 1, and the partial unique index allows one in-flight attempt per delivery, so
   two dispatchers cannot both call the provider.
4. The provider call, with no transaction, lock or pooled connection held.
5. `finish`: the outcome, classified (`sender.classify`), decided (`retry.policy.decide`)
   and recorded in one statement (`sender.log.record`); side effects (suppression of a bad
   address, a dead letter) in the same transaction. A provider callback that already moved
   the delivery on is never overwritten.
6. After that commit: parked callbacks for the delivery are applied (only when the record
   says some exist), and the breaker's bookkeeping.

If the process dies between 3 and 5, the attempt stays `in_progress`; the retry package's
sweeper finds it and turns it into `unknown`, to be settled by a callback carrying the
delivery id / derived key.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Histogram
from sqlalchemy.ext.asyncio import AsyncEngine

from retry.policy import Action, Failure, backoff_from_settings, decide, settle_reason
from retry.settings import RetrySettings
from retry.shared import UNAVAILABLE_REASON, SharedStateUnavailable
from sender import log as dlog
from sender import status as st
from sender.classify import (
    ACCEPTED,
    ACCOUNT,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    TRANSIENT,
    UNKNOWN_OUTCOME,
    Classification,
    SendOutcome,
    classify,
)
from sender.providers.base import OutgoingMessage, Provider, scrub
from sender.reputation import REASON_PREFIX, ReputationGuard, identity_of
from suppression import service as suppression
from suppression.crypto import AddressProtector
from suppression.db import Pg, new_id, pg_connection, utcnow
from suppression.normalize import normalize
from suppression.tokens import issue_token, unsubscribe_url

log = logging.getLogger("gateway.sender")

# The send path's metrics (exposed by the composition root's `/metrics`). Labels are channel,
# provider, classification kinds, suppression reasons/scopes and rate-limit keys (a provider
# or a sender identity such as a From number): never a recipient, key or message id.
SEND_FLAGS = Counter(
    "gateway_provider_send_flags_total",
    "Account-configuration problems revealed by provider answers at send time.",
    ["provider", "rule"],
)
SENDS = Counter(
    "gateway_sends_total",
    "Provider calls made for deliveries, by the classification of the provider's answer.",
    ["channel", "provider", "outcome"],
)
PROVIDER_CALL_SECONDS = Histogram(
    "gateway_provider_call_seconds",
    "Duration of one provider call (send request to answer or transport error).",
    ["channel", "provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SUPPRESSION_HITS = Counter(
    "gateway_suppression_hits_total",
    "Deliveries not sent because the recipient is suppressed, by entry reason and scope.",
    ["channel", "reason", "scope"],
)
RATE_LIMIT_GRANTS = Counter(
    "gateway_rate_limit_grants_total",
    "Rate-limiter tokens granted to sends, by bucket key and priority.",
    ["key", "priority"],
)
RATE_LIMIT_DEFERRALS = Counter(
    "gateway_rate_limit_deferrals_total",
    "Sends deferred because the rate limiter had no token, by bucket key and priority.",
    ["key", "priority"],
)

Dispatch = Callable[[uuid.UUID], Awaitable[str]]
# Called after the commit that recorded an outcome, with the delivery id: apply feedback
# parked for it (the record says when there is any) / a callback that may settle an
# unknown outcome.
OnParked = Callable[[uuid.UUID], Awaitable[object]]
OnUnknownOutcome = Callable[[uuid.UUID], Awaitable[object]]


class Limiter(Protocol):
    """Rate limiter as the send path uses it (`retry.ratelimit` implements it)."""

    def acquire_many(self, key: str, priority: str, n: int) -> Awaitable[int]:
        """Take up to `n` tokens for `key` at `priority`; how many were taken (0 = not now)."""
        ...


class Breaker(Protocol):
    """Circuit breaker as the send path uses it (`retry.breaker` implements it)."""

    def allow(self, provider: str) -> Awaitable[bool]:
        """May a call to `provider` go out now?"""
        ...

    def record_success(self, provider: str) -> Awaitable[None]:
        """The provider answered (accepted, or refused for a reason of ours)."""
        ...

    def record_failure(self, provider: str, *, account_level: bool = False) -> Awaitable[None]:
        """The provider failed (or our account is in trouble: `account_level`)."""
        ...


class DeliveryNotFound(LookupError):
    """`dispatch` was given an id that is not a delivery."""


@dataclass(frozen=True)
class SenderConfig:
    """The send path's knobs (filled in by the composition root from the settings)."""

    public_url: str = "http://127.0.0.1:8000"
    default_region: str = "US"
    email_from: str = "gateway@example.com"
    sms_from: str | None = None
    # GATEWAY_TWILIO_MESSAGING_SERVICE_SID: the SMS sending identity when there is no From.
    sms_service: str | None = None
    retry: RetrySettings = field(default_factory=RetrySettings)
    # GATEWAY_SEND_ERROR_OVERRIDES, parsed: `<provider>:<code>` -> class.
    error_overrides: Mapping[str, str] = field(default_factory=dict)
    # How many deliveries of one request are sent at the same time.
    concurrency: int = 4
    # Optional `mailto:` target added to List-Unsubscribe (GATEWAY_UNSUBSCRIBE_MAILTO).
    unsubscribe_mailto: str | None = None
    # GATEWAY_MARKETING_ASYNC: `category: marketing` requests are accepted asynchronously
    # (202, deliveries queued for the workers) even without `Prefer: respond-async`.
    marketing_async: bool = False


@dataclass(frozen=True)
class Call:
    """One provider call made (or about to be made) for a delivery, and what came of it."""

    delivery_id: uuid.UUID
    attempt_id: uuid.UUID
    number: int
    provider: Provider
    message: OutgoingMessage
    priority: str
    # The delivery's attempt count including this call, and its deadline.
    attempts: int
    expires_at: dt.datetime | None
    outcome: SendOutcome | None = None


class Dispatcher:
    """Sends deliveries through the provider adapters and records every attempt."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        protector: AddressProtector,
        providers: Mapping[str, Provider],
        config: SenderConfig,
        limiter: Limiter | None = None,
        breaker: Breaker | None = None,
        on_parked: OnParked | None = None,
        on_unknown_outcome: OnUnknownOutcome | None = None,
        reputation: ReputationGuard | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.engine = engine
        self.protector = protector
        self.providers = dict(providers)
        self.config = config
        self.limiter = limiter
        self.breaker = breaker
        self.on_parked = on_parked
        self.on_unknown_outcome = on_unknown_outcome
        self.reputation = reputation
        self._clock = clock

    async def dispatch(self, delivery_id: uuid.UUID) -> str:
        """Make at most one provider attempt for a delivery; return its resulting status."""
        async with pg_connection(self.engine) as conn:
            found = await dlog.dispatchable(conn, delivery_id, self._clock())
            if found is None:
                raise DeliveryNotFound(f"no delivery {delivery_id}")
            delivery, content_encrypted = found.delivery, found.content_encrypted
            request_id = found.request_id
            if request_id:
                # This task's log lines (the worker's too, after this returns) carry the id of
                # the request that created the delivery.
                structlog.contextvars.bind_contextvars(request_id=request_id)
            final = await self._check(conn, delivery, found.hit)
            if final is not None:
                return final
            provider = self.providers.get(delivery.channel)
            if provider is None:
                raise RuntimeError(f"no provider configured for channel {delivery.channel}")
            assert delivery.recipient_encrypted is not None
            content = dlog.content_of(
                self.protector.decrypt(content_encrypted) if content_encrypted else None
            )
            message = self.outgoing(
                delivery_id=delivery.id,
                derived_key=delivery.derived_key,
                channel=delivery.channel,
                category=delivery.category,
                topic=delivery.topic,
                to=self.protector.decrypt(delivery.recipient_encrypted),
                content=content,
            )
            deferred = await self.gate(provider, message, delivery.priority)
            now = self._clock()
            if deferred is not None:
                at = self.defer_at(deferred, now)
                status = await dlog.defer(conn, delivery.id, at=at, reason=deferred, now=now)
                return status or st.QUEUED
            attempt_id = new_id()
            number = await dlog.begin_attempt(
                conn,
                delivery,
                attempt_id=attempt_id,
                provider=provider.name,
                now=now,
                request_id=request_id,
            )
            if number is None:
                # Another dispatcher has an attempt in flight, or the delivery moved on.
                return await dlog.status_of(conn, delivery.id) or st.SENDING
        call = Call(
            delivery_id=delivery.id,
            attempt_id=attempt_id,
            number=number,
            provider=provider,
            message=message,
            priority=delivery.priority,
            attempts=delivery.attempts + 1,
            expires_at=delivery.expires_at,
        )
        call = dataclasses.replace(call, outcome=await timed_send(provider, message))
        recorded = await self.finish([call])
        statuses = {d: s for d, s, _ in recorded.answers}
        if delivery.id in statuses:
            return statuses[delivery.id]
        if delivery.id in recorded.settled and delivery.id not in recorded.parked:
            # What the record set (parked feedback, applied after it, may have moved it on).
            return recorded.settled[delivery.id]
        async with pg_connection(self.engine) as conn:
            return await dlog.status_of(conn, delivery.id) or st.SENDING

    # -- step 1 -----------------------------------------------------------------------------

    async def _check(
        self, conn: Pg, delivery: dlog.DeliveryRow, hit: tuple[uuid.UUID, str, str] | None
    ) -> str | None:
        """A final status when the delivery must not be sent now, else None (and the final
        status written when there is one). `hit` is the suppression entry (id, reason,
        scope) that stops it, read with it by `sender.log.dispatchable`."""
        now = self._clock()
        if delivery.status not in st.DISPATCHABLE:
            return delivery.status
        if (
            delivery.status == st.UNKNOWN
            and delivery.next_attempt_at
            and delivery.next_attempt_at > now
        ):
            # Still inside the settle window: a callback may yet show it was sent.
            return delivery.status
        if hit is not None:
            hit_id, hit_reason, hit_scope = hit
            SUPPRESSION_HITS.labels(delivery.channel, hit_reason, hit_scope).inc()
            done = await dlog.finish_unsent(
                conn,
                delivery.id,
                expected=delivery.status,
                status=st.SUPPRESSED,
                reason=hit_reason,
                suppression_id=hit_id,
                now=now,
            )
            return st.SUPPRESSED if done else await dlog.status_of(conn, delivery.id)
        if delivery.recipient_encrypted is None:
            # The recipient was erased while the delivery waited: nobody to send to.
            done = await dlog.finish_unsent(
                conn,
                delivery.id,
                expected=delivery.status,
                status=st.FAILED,
                reason="recipient erased",
                now=now,
            )
            return st.FAILED if done else await dlog.status_of(conn, delivery.id)
        reason = settle_reason(
            backoff=backoff_from_settings(self.config.retry, delivery.channel, delivery.priority),
            attempts_made=delivery.attempts,
            now=now,
            expires_at=delivery.expires_at,
            settings=self.config.retry,
            outcome_unknown=delivery.status == st.UNKNOWN,
            transactional=delivery.category == "transactional",
            held_to_budget=delivery.status != st.QUEUED,
            deferred_since=delivery.deferred_since,
        )
        if reason is not None:
            await dlog.dead_letter(conn, delivery.id, reason=reason, last_error=None, now=now)
            return st.DEAD
        return None

    def identity(self, channel: str, sender: str | None) -> str | None:
        """The sending identity of a message from `sender` (its `from`, or None for the
        configured default) on `channel`: what the reputation guard counts it under."""
        if sender is None:
            sender = self.config.email_from if channel == "email" else self.config.sms_from
        if sender is None and channel == "sms":
            sender = self.config.sms_service
        return identity_of(channel, sender)

    def defer_at(self, reason: str, now: dt.datetime) -> dt.datetime:
        """When a delivery deferred for `reason` is due again: a reputation pause lasts at
        least until the next evaluation, other deferrals GATEWAY_RETRY_DEFER_SECONDS."""
        seconds = self.config.retry.defer_seconds
        if self.reputation is not None and reason.startswith(REASON_PREFIX):
            seconds = max(seconds, self.reputation.settings.evaluate_seconds)
        return now + dt.timedelta(seconds=seconds)

    def outgoing(
        self,
        *,
        delivery_id: uuid.UUID,
        derived_key: str,
        channel: str,
        category: str,
        topic: str | None,
        to: str,
        content: Mapping[str, Any],
    ) -> OutgoingMessage:
        """The provider-neutral message for one delivery (with RFC 8058 headers for
        marketing email)."""
        headers: list[tuple[str, str]] = []
        if channel == "email" and category == "marketing":
            headers += self._unsubscribe_headers(delivery_id, topic, to)
        sender = content.get("from")
        if sender is None:
            sender = self.config.email_from if channel == "email" else self.config.sms_from
        reply_to = content.get("reply_to") or []
        return OutgoingMessage(
            delivery_id=delivery_id,
            derived_key=derived_key,
            channel=channel,
            to=to,
            sender=sender,
            subject=content.get("subject"),
            text=content.get("text"),
            html=content.get("html"),
            body=content.get("body"),
            reply_to=tuple(reply_to),
            headers=tuple(headers),
            category=category,
        )

    def _unsubscribe_headers(
        self, delivery_id: uuid.UUID, topic: str | None, to: str
    ) -> list[tuple[str, str]]:
        # RFC 8058: one HTTPS URI (opaque token), optionally a mailto:, and the One-Click
        # POST marker. The token carries the normalized address, the topic and the delivery.
        address = normalize("email", to, self.config.default_region).key
        token = issue_token(
            self.protector,
            channel="email",
            address=address,
            topic=topic or "marketing",
            delivery_id=delivery_id,
        )
        targets = [f"<{unsubscribe_url(self.config.public_url, token)}>"]
        if self.config.unsubscribe_mailto:
            mailto = self.config.unsubscribe_mailto
            if not mailto.startswith("mailto:"):
                mailto = f"mailto:{mailto}?subject=unsubscribe"
            targets.append(f"<{mailto}>")
        return [
            ("List-Unsubscribe", ", ".join(targets)),
            ("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"),
        ]

    # -- step 2 -----------------------------------------------------------------------------

    async def gate(self, provider: Provider, message: OutgoingMessage, priority: str) -> str | None:
        """None when the call may go out now, else why it is deferred."""
        return (await self.gate_many(provider, [message], priority))[0]

    async def gate_many(
        self, provider: Provider, messages: Sequence[OutgoingMessage], priority: str
    ) -> list[str | None]:
        """`gate` for several messages of one request: one breaker question, and one limiter
        call per rate-limit key (the first ones in order get the tokens there are).

        When the limiter's or the breaker's shared state (Redis) does not answer, every
        message not yet granted is deferred with `UNAVAILABLE_REASON` (see retry.shared)."""
        verdicts: list[str | None] = [None] * len(messages)
        if self.reputation is not None:
            # First, so that a paused send spends no rate-limit token (an in-process view:
            # no round trip, see sender.reputation).
            for i, message in enumerate(messages):
                verdicts[i] = await self.reputation.verdict(
                    self.identity(message.channel, message.sender), message.category
                )
        # Messages whose verdict is not known yet (all of them until the limiter answers).
        pending = {i for i, v in enumerate(verdicts) if v is None}
        if not pending:
            return verdicts
        try:
            if self.breaker is not None and not await self.breaker.allow(provider.name):
                circuit = f"deferred: {provider.name} circuit open"
                return [v or circuit for v in verdicts]
            if self.limiter is None:
                return verdicts
            by_key: dict[str, list[int]] = {}
            for i, message in enumerate(messages):
                if i in pending:
                    by_key.setdefault(provider.limiter_key(message), []).append(i)
            for key, indexes in by_key.items():
                granted = await self.limiter.acquire_many(key, priority, len(indexes))
                if granted:
                    RATE_LIMIT_GRANTS.labels(key, priority).inc(granted)
                if granted < len(indexes):
                    RATE_LIMIT_DEFERRALS.labels(key, priority).inc(len(indexes) - granted)
                pending.difference_update(indexes)
                for i in indexes[granted:]:
                    verdicts[i] = f"deferred: rate limit {key}"
        except SharedStateUnavailable:
            # Logged once per outage by the limiter/breaker; tokens already granted for
            # other keys of this request are used.
            for i in pending:
                verdicts[i] = UNAVAILABLE_REASON
        return verdicts

    # -- step 5 and 6 -----------------------------------------------------------------------

    async def finish(
        self,
        calls: Sequence[Call],
        *,
        complete: uuid.UUID | None = None,
        begin: Sequence[Call] = (),
    ) -> dlog.Recorded:
        """Classify, decide and record the outcomes of `calls` (each with its `outcome`),
        completing message `complete` in the same statement, and write the attempts of the
        next calls `begin` (queued deliveries of the same request) in the same transaction;
        then run the hooks. `Recorded.begun` says which of `begin` may be called now."""
        now = self._clock()
        outcomes: list[dlog.Outcome] = []
        verdicts: list[Classification] = []
        for call in calls:
            assert call.outcome is not None
            verdict = classify(call.outcome, self.config.error_overrides)
            SENDS.labels(call.message.channel, call.provider.name, verdict.kind).inc()
            verdicts.append(verdict)
            outcomes.append(self._decided(call, verdict, now))
        effects = [
            (call, verdict, outcome)
            for call, verdict, outcome in zip(calls, verdicts, outcomes, strict=True)
            if outcome.status == st.DEAD
            or (verdict.kind == PERMANENT_ADDRESS and verdict.suppression_reason)
        ]
        async with pg_connection(self.engine) as conn:
            if not effects and not begin:
                recorded = await dlog.record(conn, outcomes, now=now, complete=complete)
            else:
                async with conn.transaction():
                    recorded = await dlog.record(conn, outcomes, now=now, complete=complete)
                    for call, verdict, outcome in effects:
                        if call.delivery_id in recorded.settled:
                            await self._effect(conn, call, verdict, outcome, now)
                    if begin:
                        begun = await dlog.begin_first_attempts(
                            conn,
                            [(c.delivery_id, c.attempt_id, c.provider.name) for c in begin],
                            now=now,
                            request_id=current_request_id(),
                        )
                        recorded = dataclasses.replace(recorded, begun=frozenset(begun))
        for call, verdict in zip(calls, verdicts, strict=True):
            await self._after(call, verdict, recorded)
        return recorded

    def _decided(self, call: Call, verdict: Classification, now: dt.datetime) -> dlog.Outcome:
        """The attempt's and the delivery's new state after one call (pure)."""
        outcome = call.outcome
        assert outcome is not None
        error = scrub(outcome.message, call.message.to)
        last_error: str | None = f"{verdict.reason}: {error}" if error else verdict.reason
        accepted = verdict.kind == ACCEPTED
        status, at = st.FAILED, None
        reason: str | None = verdict.reason
        if accepted:
            status, reason, last_error = st.SENT, None, None
        elif verdict.kind == PERMANENT_ADDRESS and verdict.suppression_reason:
            reason = verdict.suppression_reason
        elif verdict.kind in (TRANSIENT, ACCOUNT, UNKNOWN_OUTCOME, RECIPIENT):
            failure = {
                TRANSIENT: Failure.TRANSIENT,
                ACCOUNT: Failure.ACCOUNT,
                UNKNOWN_OUTCOME: Failure.UNKNOWN,
                RECIPIENT: Failure.RECIPIENT,
            }[verdict.kind]
            decision = decide(
                failure,
                backoff=backoff_from_settings(
                    self.config.retry, call.message.channel, call.priority
                ),
                attempts_made=call.attempts,
                now=now,
                expires_at=call.expires_at,
                settings=self.config.retry,
                retry_after=verdict.retry_after,
            )
            at = decision.at
            status = {
                Action.RETRY: st.RETRYING,
                Action.PAUSE: st.QUEUED,
                Action.SETTLE: st.UNKNOWN,
                Action.DEAD: st.DEAD,
                Action.FAIL: st.FAILED,
            }[decision.action]
            if decision.action == Action.DEAD:
                reason = decision.dead_reason
        return dlog.Outcome(
            attempt_id=call.attempt_id,
            delivery_id=call.delivery_id,
            number=call.number,
            attempt_status=_attempt_status(verdict),
            provider_message_id=outcome.provider_message_id if accepted else None,
            provider_status=st.SENT if accepted else None,
            error_code=None if accepted else _error_code(outcome),
            error_message=None if accepted else error,
            status=status,
            reason=reason,
            last_error=last_error,
            next_attempt_at=at,
        )

    async def _effect(
        self,
        conn: Pg,
        call: Call,
        verdict: Classification,
        outcome: dlog.Outcome,
        now: dt.datetime,
    ) -> None:
        if outcome.status == st.DEAD:
            assert outcome.reason is not None
            await dlog.dead_letter(
                conn,
                call.delivery_id,
                reason=outcome.reason,
                last_error=outcome.last_error,
                now=now,
            )
            return
        assert verdict.suppression_reason is not None
        address = normalize(call.message.channel, call.message.to, self.config.default_region)
        await suppression.add(
            conn,
            self.protector,
            address,
            reason=verdict.suppression_reason,
            source=suppression.Source(
                type="send_error",
                id=f"{verdict.key}:{call.delivery_id}",
                evidence={
                    "delivery_id": str(call.delivery_id),
                    "provider": call.provider.name,
                    "code": verdict.key,
                },
            ),
        )

    async def _after(self, call: Call, verdict: Classification, recorded: dlog.Recorded) -> None:
        try:
            if call.delivery_id in recorded.parked and self.on_parked:
                await self.on_parked(call.delivery_id)
            if verdict.kind == UNKNOWN_OUTCOME and self.on_unknown_outcome:
                await self.on_unknown_outcome(call.delivery_id)
        except Exception:
            # The outcome is committed; parked callbacks are also swept later.
            log.exception("post-send hook failed for delivery %s", call.delivery_id)
        name = call.provider.name
        if verdict.kind == DESTINATION:
            # Not the recipient's fault and not the provider's health: our account is not
            # set up for this destination. The delivery failed with a reason saying so; the
            # operator is told (log line, metric) and other sends go on.
            SEND_FLAGS.labels(name, verdict.key).inc()
            log.warning(
                "%s refused delivery %s for the account's configuration (%s): delivery "
                "failed; fix the provider account to send to this destination",
                name,
                call.delivery_id,
                verdict.reason,
            )
        if self.breaker is None:
            return
        try:
            # Only provider-wide outcomes count against the circuit: a refusal about one
            # recipient, destination or message shows that the provider is answering.
            if verdict.kind == ACCOUNT:
                await self.breaker.record_failure(name, account_level=True)
            elif verdict.provider_wide:
                await self.breaker.record_failure(name)
            else:
                await self.breaker.record_success(name)
        except SharedStateUnavailable:
            pass  # Redis is down: logged once per outage, and sends are deferred meanwhile
        except Exception:
            log.exception("circuit breaker bookkeeping failed for %s", name)

    async def close(self) -> None:
        """Close every provider adapter."""
        for provider in self.providers.values():
            await provider.close()


def current_request_id() -> str | None:
    """The id of the request this task works for, as the composition root bound it in the
    log context (`structlog.contextvars`): the HTTP request's, or for the worker the id of
    the request that created the delivery. None outside any request."""
    value = structlog.contextvars.get_contextvars().get("request_id")
    return value if isinstance(value, str) else None


async def timed_send(provider: Provider, message: OutgoingMessage) -> SendOutcome:
    """`provider.send(message)`, its duration observed in `gateway_provider_call_seconds`."""
    started = time.perf_counter()
    try:
        return await provider.send(message)
    finally:
        PROVIDER_CALL_SECONDS.labels(message.channel, provider.name).observe(
            time.perf_counter() - started
        )


def _attempt_status(verdict: Classification) -> str:
    return {
        ACCEPTED: st.AttemptStatus.ACCEPTED,
        TRANSIENT: st.AttemptStatus.TRANSIENT,
        PERMANENT_MESSAGE: st.AttemptStatus.FAILED,
        PERMANENT_ADDRESS: st.AttemptStatus.FAILED,
        RECIPIENT: st.AttemptStatus.FAILED,
        DESTINATION: st.AttemptStatus.FAILED,
        ACCOUNT: st.AttemptStatus.DEFERRED,
        UNKNOWN_OUTCOME: st.AttemptStatus.UNKNOWN,
    }[verdict.kind].value


def _error_code(outcome: SendOutcome) -> str:
    if outcome.error_code:
        return outcome.error_code[:64]
    if outcome.transport:
        return f"connection_{outcome.transport}"
    if outcome.http_status is not None:
        return f"http_{outcome.http_status}"
    return "error"
