"""The dispatch procedure: one provider attempt for one delivery, crash-safe.

`Dispatcher.dispatch(delivery_id)` is used for the first send of every delivery and by the
retry worker for every later attempt (the same code path):

1. Checks, in a short transaction with the delivery row locked: still dispatchable, not
   suppressed (re-checked every time), not past its deadline, attempt budget left; a settled
   `unknown` follows the unknown-outcome policy.
2. Circuit breaker and rate limiter (no transaction open). No token or an open circuit: the
   delivery is deferred (`queued`, near `next_attempt_at`), no attempt is counted, the
   provider is not called.
3. The attempt row is written `in_progress` and COMMITTED (status `sending`); the partial
   unique index allows one in-flight attempt per delivery, so two dispatchers cannot both
   call the provider.
4. The provider call, with no transaction or lock held.
5. The outcome, classified (`sender.classify`), recorded in a second short transaction; a
   provider callback that already moved the delivery on is never overwritten.
6. After that commit: the `on_provider_id` hook (so parked callbacks get applied) and the
   breaker's bookkeeping.

If the process dies between 3 and 5, the attempt stays `in_progress`; the retry package's
sweeper finds it and turns it into `unknown`, to be settled by a callback carrying the
delivery id / derived key.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry.dlq import dead_letter
from retry.policy import backoff_from_settings, delay_seconds, next_attempt_at
from retry.queue import schedule
from retry.settings import RetrySettings
from sender import status as st
from sender.classify import (
    ACCEPTED,
    ACCOUNT,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    TRANSIENT,
    UNKNOWN_OUTCOME,
    Classification,
    SendOutcome,
    classify,
)
from sender.models import Attempt, Delivery, Message
from sender.providers.base import OutgoingMessage, Provider, scrub
from suppression import service as suppression
from suppression.crypto import AddressProtector
from suppression.db import utcnow
from suppression.normalize import normalize
from suppression.tokens import issue_token, unsubscribe_url

log = logging.getLogger("gateway.sender")

Dispatch = Callable[[uuid.UUID], Awaitable[str]]
OnProviderId = Callable[[str, str], Awaitable[object]]
OnUnknownOutcome = Callable[[uuid.UUID], Awaitable[object]]


class Limiter(Protocol):
    """Rate limiter as the send path uses it (`retry.ratelimit` implements it)."""

    def acquire(self, key: str, priority: str) -> Awaitable[bool]:
        """Take one token for `key` at `priority`; False = not now."""
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
    retry: RetrySettings = field(default_factory=RetrySettings)
    # GATEWAY_SEND_ERROR_OVERRIDES, parsed: `<provider>:<code>` -> class.
    error_overrides: Mapping[str, str] = field(default_factory=dict)
    # How many deliveries of one request are sent at the same time.
    concurrency: int = 4
    # Optional `mailto:` target added to List-Unsubscribe (GATEWAY_UNSUBSCRIBE_MAILTO).
    unsubscribe_mailto: str | None = None


@dataclass(frozen=True)
class _Plan:
    """What step 1 decided: either a final answer or a message ready for the provider."""

    status: str
    provider: Provider | None = None
    message: OutgoingMessage | None = None
    priority: str = "normal"
    attempt_id: uuid.UUID | None = None
    number: int = 0


@dataclass(frozen=True)
class FreshDelivery:
    """A just-created delivery, as the pre-gate check would see it (`Dispatcher.fresh`)."""

    provider: Provider
    message: OutgoingMessage
    priority: str


class Dispatcher:
    """Sends deliveries through the provider adapters and records every attempt."""

    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        protector: AddressProtector,
        providers: Mapping[str, Provider],
        config: SenderConfig,
        limiter: Limiter | None = None,
        breaker: Breaker | None = None,
        on_provider_id: OnProviderId | None = None,
        on_unknown_outcome: OnUnknownOutcome | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.sessions = sessions
        self.protector = protector
        self.providers = dict(providers)
        self.config = config
        self.limiter = limiter
        self.breaker = breaker
        # Called after the commit that recorded a provider message id (parked callbacks
        # for it can now be applied) / an unknown outcome (a callback that arrived during the
        # call may settle it).
        self.on_provider_id = on_provider_id
        self.on_unknown_outcome = on_unknown_outcome
        self._clock = clock

    async def dispatch(self, delivery_id: uuid.UUID, *, fresh: FreshDelivery | None = None) -> str:
        """Make at most one provider attempt for a delivery; return its resulting status.

        `fresh` (the send service's first dispatch only) stands in for the pre-gate read:
        the delivery was created and checked against the suppression list moments ago in
        the same request. Everything is checked again, under the row lock, before the
        attempt is written (step 3), so a change in between is still seen.
        """
        plan = (
            self._fresh_plan(fresh)
            if fresh is not None
            else await self._prepare(delivery_id, begin=False)
        )
        if plan.provider is None or plan.message is None:
            return plan.status
        provider, message = plan.provider, plan.message
        deferred = await self._gate(provider, message, plan.priority)
        if deferred is not None:
            return await self._defer(delivery_id, deferred)
        plan = await self._prepare(delivery_id, begin=True)
        if plan.provider is None or plan.message is None or plan.attempt_id is None:
            return plan.status
        outcome = await plan.provider.send(plan.message)
        return await self._record(
            delivery_id, plan.attempt_id, plan.number, plan.provider, plan.message, outcome
        )

    # -- step 1 and 3 -----------------------------------------------------------------------

    def fresh(self, delivery: Delivery, content: Mapping[str, Any]) -> FreshDelivery | None:
        """What `dispatch(..., fresh=)` needs about a delivery just created (not yet sent).

        `delivery` is the new, queued, unsuppressed row as added; `content` the message
        content in plaintext. None when no provider serves the channel (then `dispatch`
        takes its ordinary path, which reports that).
        """
        provider = self.providers.get(delivery.channel)
        if provider is None or delivery.recipient_encrypted is None:
            return None
        return FreshDelivery(
            provider=provider,
            message=self._outgoing_from(
                delivery, self.protector.decrypt(delivery.recipient_encrypted), content
            ),
            priority=st.RANK_PRIORITY.get(delivery.priority_rank, "normal"),
        )

    def _fresh_plan(self, fresh: FreshDelivery) -> _Plan:
        return _Plan(st.QUEUED, fresh.provider, fresh.message, fresh.priority)

    async def _prepare(self, delivery_id: uuid.UUID, *, begin: bool) -> _Plan:
        async with self.sessions() as session:
            # One round trip for both rows; only the delivery is locked (as before).
            row = (
                await session.execute(
                    select(Delivery, Message)
                    .join(Message, Message.id == Delivery.message_id)
                    .where(Delivery.id == delivery_id)
                    .with_for_update(of=Delivery)
                )
            ).first()
            if row is None:
                raise DeliveryNotFound(f"no delivery {delivery_id}")
            delivery, message = row
            final = await self._check(session, delivery)
            if final is not None:
                await session.commit()
                return _Plan(final)
            provider = self.providers.get(delivery.channel)
            if provider is None:
                raise RuntimeError(f"no provider configured for channel {delivery.channel}")
            outgoing = self._outgoing(delivery, message, with_headers=begin)
            priority = st.RANK_PRIORITY.get(delivery.priority_rank, "normal")
            if not begin:
                await session.commit()
                return _Plan(delivery.status, provider, outgoing, priority)
            attempt_id = uuid.uuid4()
            try:
                # Attempt numbers keep counting across a dead-letter redrive, which resets
                # the budget counter (`delivery.attempts`) but keeps the history: the next
                # number is computed in the INSERT itself, under the delivery lock.
                number = await session.scalar(
                    insert(Attempt)
                    .values(
                        id=attempt_id,
                        delivery_id=delivery.id,
                        number=select(func.coalesce(func.max(Attempt.number), 0) + 1)
                        .where(Attempt.delivery_id == delivery.id)
                        .scalar_subquery(),
                        status=st.AttemptStatus.IN_PROGRESS.value,
                        provider=provider.name,
                        started_at=self._clock(),
                    )
                    .returning(Attempt.number)
                )
                assert number is not None
                delivery.status = st.SENDING
                delivery.attempts += 1
                delivery.provider = provider.name
                delivery.next_attempt_at = None
                delivery.updated_at = self._clock()
                await session.commit()
            except IntegrityError:
                # Another dispatcher has an attempt in flight for this delivery.
                await session.rollback()
                current = await session.scalar(
                    select(Delivery.status).where(Delivery.id == delivery_id)
                )
                return _Plan(current or st.SENDING)
            return _Plan(st.SENDING, provider, outgoing, priority, attempt_id, number)

    async def _check(self, session: AsyncSession, delivery: Delivery) -> str | None:
        """A final status when the delivery must not be sent now, else None."""
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
        hit = await suppression.check(
            session,
            delivery.channel,
            delivery.recipient_hash,
            category=delivery.category,
            topic=delivery.topic,
            now=now,
        )
        if hit is not None:
            delivery.status = st.SUPPRESSED
            delivery.reason = hit.reason
            delivery.suppression_id = hit.id
            delivery.next_attempt_at = None
            delivery.updated_at = now
            return st.SUPPRESSED
        if delivery.expires_at is not None and delivery.expires_at <= now:
            await dead_letter(
                session, delivery.id, reason="expired", last_error=delivery.last_error
            )
            return st.DEAD
        if delivery.recipient_encrypted is None:
            # The recipient was erased while the delivery waited: nobody to send to.
            delivery.status = st.FAILED
            delivery.reason = "recipient erased"
            delivery.next_attempt_at = None
            delivery.updated_at = now
            return st.FAILED
        if delivery.status == st.UNKNOWN and delivery.category != "transactional":
            # DESIGN: a second marketing message is billed and annoys; transactional retries.
            if self.config.retry.unknown_outcome_marketing == "dead_letter":
                await dead_letter(
                    session, delivery.id, reason="unknown_outcome", last_error=delivery.last_error
                )
                return st.DEAD
        backoff = backoff_from_settings(
            self.config.retry,
            delivery.channel,
            st.RANK_PRIORITY.get(delivery.priority_rank, "normal"),
        )
        if delivery.attempts >= backoff.max_attempts and delivery.status != st.QUEUED:
            await dead_letter(
                session, delivery.id, reason="max_attempts", last_error=delivery.last_error
            )
            return st.DEAD
        return None

    def _outgoing(
        self, delivery: Delivery, message: Message, *, with_headers: bool
    ) -> OutgoingMessage:
        assert delivery.recipient_encrypted is not None
        to = self.protector.decrypt(delivery.recipient_encrypted)
        content: dict[str, Any] = (
            json.loads(self.protector.decrypt(message.content_encrypted))
            if message.content_encrypted
            else {}
        )
        return self._outgoing_from(delivery, to, content, with_headers=with_headers)

    def _outgoing_from(
        self,
        delivery: Delivery,
        to: str,
        content: Mapping[str, Any],
        *,
        with_headers: bool = False,
    ) -> OutgoingMessage:
        headers: list[tuple[str, str]] = []
        if with_headers and delivery.channel == "email" and delivery.category == "marketing":
            headers += self._unsubscribe_headers(delivery, to)
        sender = content.get("from")
        if sender is None:
            sender = self.config.email_from if delivery.channel == "email" else self.config.sms_from
        reply_to = content.get("reply_to") or []
        return OutgoingMessage(
            delivery_id=delivery.id,
            derived_key=delivery.derived_key,
            channel=delivery.channel,
            to=to,
            sender=sender,
            subject=content.get("subject"),
            text=content.get("text"),
            html=content.get("html"),
            body=content.get("body"),
            reply_to=tuple(reply_to),
            headers=tuple(headers),
            category=delivery.category,
        )

    def _unsubscribe_headers(self, delivery: Delivery, to: str) -> list[tuple[str, str]]:
        # RFC 8058: one HTTPS URI (opaque token), optionally a mailto:, and the One-Click
        # POST marker. The token carries the normalized address, the topic and the delivery.
        address = normalize("email", to, self.config.default_region).key
        token = issue_token(
            self.protector,
            channel="email",
            address=address,
            topic=delivery.topic or "marketing",
            delivery_id=delivery.id,
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

    async def _gate(
        self, provider: Provider, message: OutgoingMessage, priority: str
    ) -> str | None:
        """None when the call may go out now, else why it is deferred."""
        if self.breaker is not None and not await self.breaker.allow(provider.name):
            return f"deferred: {provider.name} circuit open"
        if self.limiter is not None and not await self.limiter.acquire(
            provider.limiter_key(message), priority
        ):
            return f"deferred: rate limit {provider.limiter_key(message)}"
        return None

    async def _defer(self, delivery_id: uuid.UUID, reason: str) -> str:
        at = self._clock() + dt.timedelta(seconds=self.config.retry.defer_seconds)
        async with self.sessions() as session:
            delivery = await session.get(Delivery, delivery_id, with_for_update=True)
            if delivery is None or delivery.status not in st.DISPATCHABLE:
                return delivery.status if delivery else st.QUEUED
            await schedule(session, delivery_id, at=at, status=st.QUEUED, reason=reason)
            await session.commit()
        return st.QUEUED

    # -- step 5 and 6 -----------------------------------------------------------------------

    async def _record(
        self,
        delivery_id: uuid.UUID,
        attempt_id: uuid.UUID,
        number: int,
        provider: Provider,
        message: OutgoingMessage,
        outcome: SendOutcome,
    ) -> str:
        verdict = classify(outcome, self.config.error_overrides)
        error = scrub(outcome.message, message.to)
        now = self._clock()
        async with self.sessions() as session:
            delivery = await session.get(Delivery, delivery_id, with_for_update=True)
            assert delivery is not None
            values: dict[str, Any] = {"finished_at": now, "status": _attempt_status(verdict)}
            if verdict.kind == ACCEPTED:
                # A callback that settled this attempt first keeps what it recorded (the
                # NULLIF keeps Python's `or`: an empty value counts as none).
                values["provider_message_id"] = func.coalesce(
                    func.nullif(Attempt.provider_message_id, ""), outcome.provider_message_id
                )
                values["provider_status"] = func.coalesce(
                    func.nullif(Attempt.provider_status, ""), st.SENT
                )
                values["error_code"] = None
                values["error_message"] = None
            else:
                values["error_code"] = _error_code(outcome)
                values["error_message"] = error
            # Only the latest attempt may move the delivery, and only from our own states: a
            # provider callback that got here first (correlated by delivery id) is the truth.
            # The latest number is read in the same statement that updates (and so locks)
            # the attempt, after the delivery lock above, as a separate read would be.
            latest_number = (
                select(func.max(Attempt.number))
                .where(Attempt.delivery_id == delivery_id)
                .scalar_subquery()
            )
            row = (
                await session.execute(
                    update(Attempt)
                    .where(Attempt.id == attempt_id)
                    .values(values)
                    .returning(latest_number)
                    .execution_options(synchronize_session=False)
                )
            ).first()
            assert row is not None
            latest = row[0]
            current = latest == number and delivery.status in (st.SENDING, st.UNKNOWN)
            if verdict.kind == ACCEPTED and latest == number:
                delivery.provider_message_id = (
                    delivery.provider_message_id or outcome.provider_message_id
                )
            if current:
                await self._apply(session, delivery, verdict, error, message, now)
            delivery.updated_at = now
            await session.commit()
            result = delivery.status
        await self._after(delivery_id, provider, verdict, outcome)
        return result

    async def _apply(
        self,
        session: AsyncSession,
        delivery: Delivery,
        verdict: Classification,
        error: str | None,
        message: OutgoingMessage,
        now: dt.datetime,
    ) -> None:
        retry = self.config.retry
        priority = st.RANK_PRIORITY.get(delivery.priority_rank, "normal")
        backoff = backoff_from_settings(retry, delivery.channel, priority)
        last_error = f"{verdict.reason}: {error}" if error else verdict.reason
        if verdict.kind == ACCEPTED:
            delivery.status = st.SENT
            delivery.reason = None
            delivery.next_attempt_at = None
            return
        if verdict.kind in (PERMANENT_MESSAGE, PERMANENT_ADDRESS):
            delivery.status = st.FAILED
            delivery.reason = verdict.reason
            delivery.last_error = last_error
            delivery.next_attempt_at = None
            if verdict.kind == PERMANENT_ADDRESS and verdict.suppression_reason:
                address = normalize(delivery.channel, message.to, self.config.default_region)
                await suppression.add(
                    session,
                    self.protector,
                    address,
                    reason=verdict.suppression_reason,
                    source=suppression.Source(
                        type="send_error",
                        id=f"{verdict.key}:{delivery.id}",
                        evidence={
                            "delivery_id": str(delivery.id),
                            "provider": delivery.provider,
                            "code": verdict.key,
                        },
                    ),
                )
                delivery.reason = verdict.suppression_reason
            return
        if verdict.kind == UNKNOWN_OUTCOME:
            at = now + dt.timedelta(seconds=retry.unknown_settle_seconds)
            await _requeue(session, delivery, at, st.UNKNOWN, verdict.reason, last_error)
            return
        if verdict.kind == ACCOUNT:
            # Not the recipient's fault: no suppression, no failure; wait and try again. A
            # `queued` delivery is not held to the attempt budget (only the deadline bounds
            # it). It comes back no sooner than the breaker's account cool-down (the breaker,
            # told below, keeps every other call away meanwhile): such problems need a human.
            delay = max(
                retry.defer_seconds,
                retry.breaker_account_cooldown_seconds,
                delay_seconds(backoff, delivery.attempts, retry_after=verdict.retry_after),
            )
            at = now + dt.timedelta(seconds=delay)
            await _requeue(session, delivery, at, st.QUEUED, verdict.reason, last_error)
            return
        assert verdict.kind == TRANSIENT
        at_or_none = next_attempt_at(
            backoff,
            delivery.attempts,
            now,
            expires_at=delivery.expires_at,
            retry_after=verdict.retry_after,
        )
        if at_or_none is None:
            reason = "max_attempts" if delivery.attempts >= backoff.max_attempts else "expired"
            delivery.last_error = last_error
            await session.flush()
            await dead_letter(session, delivery.id, reason=reason, last_error=last_error)
            await session.refresh(delivery)
            return
        await _requeue(session, delivery, at_or_none, st.RETRYING, verdict.reason, last_error)

    async def _after(
        self,
        delivery_id: uuid.UUID,
        provider: Provider,
        verdict: Classification,
        outcome: SendOutcome,
    ) -> None:
        try:
            if verdict.kind == ACCEPTED and outcome.provider_message_id and self.on_provider_id:
                await self.on_provider_id(provider.name, outcome.provider_message_id)
            if verdict.kind == UNKNOWN_OUTCOME and self.on_unknown_outcome:
                await self.on_unknown_outcome(delivery_id)
        except Exception:
            # The outcome is committed; parked callbacks are also swept later.
            log.exception("post-send hook failed for delivery %s", delivery_id)
        if self.breaker is None:
            return
        try:
            if verdict.kind in (ACCEPTED, PERMANENT_MESSAGE, PERMANENT_ADDRESS):
                await self.breaker.record_success(provider.name)
            elif verdict.kind == ACCOUNT:
                await self.breaker.record_failure(provider.name, account_level=True)
            else:
                await self.breaker.record_failure(provider.name)
        except Exception:
            log.exception("circuit breaker bookkeeping failed for %s", provider.name)

    async def close(self) -> None:
        """Close every provider adapter."""
        for provider in self.providers.values():
            await provider.close()


def _attempt_status(verdict: Classification) -> str:
    return {
        ACCEPTED: st.AttemptStatus.ACCEPTED,
        TRANSIENT: st.AttemptStatus.TRANSIENT,
        PERMANENT_MESSAGE: st.AttemptStatus.FAILED,
        PERMANENT_ADDRESS: st.AttemptStatus.FAILED,
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


async def _requeue(
    session: AsyncSession,
    delivery: Delivery,
    at: dt.datetime,
    status: str,
    reason: str | None,
    last_error: str | None,
) -> None:
    """Put the delivery back on the retry queue and keep the loaded row in step with it."""
    await schedule(session, delivery.id, at=at, status=status, reason=reason, last_error=last_error)
    delivery.status, delivery.next_attempt_at = status, at
    delivery.reason, delivery.last_error = reason, last_error
