"""The feedback path after verification: store once, correlate, advance, classify, act.

`FeedbackIngestor` takes verified provider payloads (the HTTP endpoints and the sandbox
providers call it) and, in one short transaction per callback:

1. parses them into normalized events (one per recipient);
2. claims each event once in the event store (`webhooks.store.claim`); a copy that was
   already stored is a ``duplicate`` and does nothing else;
3. correlates it to an attempt and its delivery: by provider message id, else by the
   delivery id / derived key the send attached (SES tag or header, Twilio ``d``). A
   callback for an attempt whose outcome is ``unknown`` settles it (``accepted`` with that
   provider id). Nothing known yet (the callback beat the send's commit): ``parked``,
   applied by `apply_parked` once the send recorded the provider id, or when the next event
   for the same message arrives;
4. advances the attempt and the delivery by the pure state machine (`webhooks.state`):
   ``applied``, or ``duplicate``/``regression`` when it does not advance;
5. acts on the classification (`webhooks.classify`) of the *address*, whatever the
   delivery: suppression (hard bounce, complaint, STOP, invalid number, topic
   unsubscribes), soft-bounce counting, provider flagging. A transient failure of the
   delivery's latest attempt only schedules the bounded retry (or dead-letters it when the
   budget or deadline is spent): no callback ever sends anything itself.

Events with nothing to apply (engagement, not-spam complaints, unknown types, HELP) are
recorded as ``ignored``.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry.policy import Backoff, backoff_from_settings, next_attempt_at
from retry.settings import RetrySettings
from sender import log as dlog
from sender.models import Attempt, Delivery
from sender.status import (
    BOUNCED,
    COMPLAINED,
    DEAD,
    FAILED,
    GATEWAY_STATES,
    RANK_PRIORITY,
    RETRYING,
    AttemptStatus,
)
from suppression import service
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import pg_of, utcnow
from suppression.normalize import Address
from webhooks import ses, store, twilio
from webhooks.classify import OUTCOMES, Classification, Outcome, classify
from webhooks.events import FeedbackEvent, storable
from webhooks.models import ProviderEvent
from webhooks.settings import WebhookSettings
from webhooks.state import (
    APPLIED,
    DUPLICATE,
    IGNORED,
    PARKED,
    POSITIVE,
    REGRESSION,
    TRANSIENT,
    provider_state,
    step,
)

log = logging.getLogger("gateway.webhooks")

# (provider, disposition) -> events handled since the process started.
EVENTS: collections.Counter[tuple[str, str]] = collections.Counter()
# (provider, rule) -> account-level problems reported by feedback (provider flagged).
PROVIDER_FLAGS: collections.Counter[tuple[str, str]] = collections.Counter()

# Called after commit with (provider, rule) for account-level problems (e.g. the breaker).
AccountProblemHook = Callable[[str, str], Awaitable[None]]

# The topic an "unsubscribe from everything" of SES subscription management suppresses,
# besides every topic it lists (DESIGN "Scope": an unsubscribe defaults to `marketing`).
DEFAULT_TOPIC = "marketing"
_FAILURE_STATES = frozenset({BOUNCED, COMPLAINED, FAILED, TRANSIENT})


@dataclass
class _Target:
    """Where an event lands: a delivery and (usually) one of its attempts, or nowhere yet."""

    delivery: Delivery | None = None
    attempt: Attempt | None = None
    # Set when the event must wait (parked) although its delivery is already known.
    parked_delivery_id: uuid.UUID | None = None

    @property
    def parked(self) -> bool:
        return self.delivery is None

    @property
    def delivery_id(self) -> uuid.UUID | None:
        return self.delivery.id if self.delivery is not None else self.parked_delivery_id

    @property
    def attempt_id(self) -> uuid.UUID | None:
        return self.attempt.id if self.attempt is not None else None


class FeedbackIngestor:
    """Stores, correlates and applies verified provider feedback (see the module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        protector: AddressProtector,
        settings: WebhookSettings,
        *,
        retry: RetrySettings,
        default_region: str = "US",
        on_account_problem: AccountProblemHook | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self._sessions = sessions
        self._protector = protector
        self._settings = settings
        self._retry = retry
        self._region = default_region
        self._on_account_problem = on_account_problem
        self._clock = clock
        self._rng = rng

    # ---- entry points ------------------------------------------------------------------

    async def ses_message(self, message: dict[str, Any], *, event_id: str) -> list[str]:
        """One SES notification (the JSON inside the SNS ``Message``); `event_id` = MessageId.

        Returns one disposition per recipient event.
        """
        return await self.ingest(
            ses.parse_notification(message, event_id=event_id, default_region=self._region)
        )

    async def twilio_status(
        self,
        params: Mapping[str, str],
        *,
        query: Mapping[str, str],
        idempotency_token: str | None,
    ) -> list[str]:
        """One Twilio status callback (`query` is the callback URL's query, with ``d``)."""
        event = twilio.parse_status(
            params, query=query, idempotency_token=idempotency_token, default_region=self._region
        )
        return await self.ingest([event])

    async def twilio_inbound(
        self, params: Mapping[str, str], *, idempotency_token: str | None
    ) -> list[str]:
        """One inbound SMS (STOP/START/HELP handling; anything else is recorded only)."""
        event = twilio.parse_inbound(
            params, idempotency_token=idempotency_token, default_region=self._region
        )
        return await self.ingest([event])

    async def ingest(self, events: Sequence[FeedbackEvent]) -> list[str]:
        """Apply normalized events in one transaction; one disposition per event."""
        flags: list[tuple[str, str]] = []
        events = [storable(event) for event in events]
        async with self._sessions() as session:
            dispositions = [await self._one(session, event, flags) for event in events]
            await session.commit()
        for event, disposition in zip(events, dispositions, strict=True):
            EVENTS[(event.provider, disposition)] += 1
        await self._flag(flags)
        return dispositions

    async def record(self, event: FeedbackEvent, *, disposition: str = IGNORED) -> str:
        """Store an event that is not applied to anything (e.g. SNS confirmations).

        Returns `disposition`, or ``duplicate`` when it was stored before.
        """
        event = storable(event)
        async with self._sessions() as session:
            row_id = await store.claim(
                session,
                self._protector,
                event,
                recipient_hash=None,
                details={**event.details, store.CHANNEL_KEY: event.channel},
                disposition=disposition,
            )
            await session.commit()
        result = disposition if row_id is not None else DUPLICATE
        EVENTS[(event.provider, result)] += 1
        return result

    async def apply_parked(self, provider: str, provider_message_id: str) -> int:
        """Apply the events parked for a provider message id; how many were applied.

        The send path calls this after it committed the provider message id of an attempt.
        """
        async with self._sessions() as session:
            rows = await store.parked(
                session, provider=provider, provider_message_id=provider_message_id
            )
            applied = await self._apply_rows(session, rows)
            await session.commit()
        return applied

    async def apply_parked_for_delivery(self, delivery_id: uuid.UUID) -> int:
        """Apply the events parked for a delivery that was known but mid-send at the time.

        For the send path after it recorded an attempt's outcome *without* a provider id
        (``unknown``): a callback that arrived during the call then settles that attempt.
        """
        async with self._sessions() as session:
            rows = await store.parked(session, delivery_id=delivery_id)
            applied = await self._apply_rows(session, rows)
            await session.commit()
        return applied

    async def sweep_parked(self, limit: int = 500, max_age_seconds: float = 86400.0) -> int:
        """Apply parked events that can be correlated now; how many were applied.

        Picks recent parked events whose provider message id has become known, or whose
        delivery no longer has a call in flight (its attempt may now be settled). Closes the
        window where an event was parked while the send committed concurrently, and covers
        a send path that never called `apply_parked`; a periodic job may call it.
        """
        since = self._clock() - dt.timedelta(seconds=max_age_seconds)
        pmid = ProviderEvent.provider_message_id
        in_flight = exists().where(
            Attempt.delivery_id == ProviderEvent.delivery_id,
            Attempt.status == AttemptStatus.IN_PROGRESS.value,
        )
        async with self._sessions() as session:
            rows = list(
                await session.scalars(
                    select(ProviderEvent)
                    .where(
                        ProviderEvent.disposition == PARKED,
                        ProviderEvent.received_at >= since,
                        or_(
                            exists().where(Attempt.provider_message_id == pmid),
                            exists().where(Delivery.provider_message_id == pmid),
                            and_(ProviderEvent.delivery_id.is_not(None), ~in_flight),
                        ),
                    )
                    .order_by(ProviderEvent.received_at)
                    .limit(limit)
                    .with_for_update(skip_locked=True)
                )
            )
            applied = await self._apply_rows(session, rows)
            await session.commit()
        return applied

    # ---- one event ---------------------------------------------------------------------

    async def _one(
        self, session: AsyncSession, event: FeedbackEvent, flags: list[tuple[str, str]]
    ) -> str:
        classification = classify(event, self._settings.classification_overrides)
        outcome = classification.outcome
        recipient_hash = (
            self._protector.hash(event.channel, event.recipient.key) if event.recipient else None
        )
        details: dict[str, Any] = {
            **event.details,
            store.CHANNEL_KEY: event.channel,
            store.OUTCOME_KEY: outcome.name,
            store.RULE_KEY: classification.rule,
        }
        if event.delivery_ref:
            details[store.REF_KEY] = event.delivery_ref[:128]
        row_id = await store.claim(
            session,
            self._protector,
            event,
            recipient_hash=recipient_hash,
            details=details,
            disposition=IGNORED,
        )
        if row_id is None:
            return DUPLICATE
        now = self._clock()
        if outcome.name == "inbound":
            disposition = await self._inbound(session, event, recipient_hash, now)
            await store.finish(
                session, row_id, disposition=disposition, delivery_id=None, attempt_id=None
            )
            return disposition

        if outcome.state is not None:
            target = await self._correlate(session, event)
            if target.parked:
                disposition = PARKED
            elif not self._matches(event, recipient_hash, target):
                disposition = IGNORED
            else:
                # Events parked earlier for this message arrived first: apply them first.
                if await self._drain(session, event, target):
                    target = await self._correlate(session, event)  # refresh after their writes
                disposition = await self._advance(session, event, classification, target, now)
        else:
            target = await self._lookup(session, event)
            disposition = IGNORED

        address = event.recipient or self._delivery_address(target)
        changed = await self._address_effects(session, event, outcome, address, target, now)
        if outcome.flag_provider:
            flags.append((event.provider, classification.rule))
        if changed and disposition in (IGNORED, DUPLICATE, REGRESSION):
            disposition = APPLIED
        await store.finish(
            session,
            row_id,
            disposition=disposition,
            delivery_id=target.delivery_id,
            attempt_id=target.attempt_id,
        )
        if disposition == PARKED and target.parked_delivery_id is not None:
            # Its call is in flight: the send path applies it right after recording.
            await dlog.note_parked(await pg_of(session), target.parked_delivery_id)
        if disposition == PARKED:
            log.info(
                "parked %s event %s for unknown message %s",
                event.provider,
                event.event_type,
                event.provider_message_id,
            )
        return disposition

    # ---- correlation -------------------------------------------------------------------

    async def _correlate(self, session: AsyncSession, event: FeedbackEvent) -> _Target:
        """Find and lock the event's delivery (then attempt); settle an unknown attempt."""
        pmid = event.provider_message_id
        if pmid:
            target = await self._by_provider_id(session, pmid)
            if target is not None:
                return target
        if not event.delivery_ref:
            return _Target()
        delivery = await self._lock_delivery_by_ref(session, event.delivery_ref)
        if delivery is None:
            return _Target()
        attempts = list(
            await session.scalars(
                select(Attempt)
                .where(Attempt.delivery_id == delivery.id)
                .order_by(Attempt.number)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
        )
        if not pmid:
            return _Target(delivery, attempts[-1] if attempts else None)
        for attempt in attempts:
            # The send may have committed the id while we waited for the delivery lock.
            if attempt.provider_message_id == pmid:
                return _Target(delivery, attempt)
        if delivery.provider_message_id == pmid:
            return _Target(delivery, None)
        if any(a.status == AttemptStatus.IN_PROGRESS for a in attempts):
            # A call is in flight: the id may be its own. Wait for the send to record it.
            return _Target(parked_delivery_id=delivery.id)
        settle = _settle_candidate(attempts)
        if settle is None:
            return _Target(parked_delivery_id=delivery.id)
        # DESIGN "Unknown outcome": a callback carrying our key proves the provider took it.
        log.info(
            "callback settled attempt %s of delivery %s (was %s)",
            settle.number,
            delivery.id,
            settle.status,
        )
        settle.status = AttemptStatus.ACCEPTED.value
        settle.provider_message_id = pmid
        if delivery.provider_message_id is None:
            delivery.provider_message_id = pmid
        await session.flush()
        return _Target(delivery, settle)

    async def _by_provider_id(self, session: AsyncSession, pmid: str) -> _Target | None:
        delivery_id = await session.scalar(
            select(Attempt.delivery_id).where(Attempt.provider_message_id == pmid)
        )
        if delivery_id is not None:
            delivery = await session.scalar(
                select(Delivery)
                .where(Delivery.id == delivery_id)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
            attempt = await session.scalar(
                select(Attempt)
                .where(Attempt.provider_message_id == pmid)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
            if delivery is not None and attempt is not None:
                return _Target(delivery, attempt)
        delivery = await session.scalar(
            select(Delivery)
            .where(Delivery.provider_message_id == pmid)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        return _Target(delivery, None) if delivery is not None else None

    async def _lock_delivery_by_ref(self, session: AsyncSession, ref: str) -> Delivery | None:
        return await session.scalar(
            select(Delivery)
            .where(_ref_condition(ref))
            .limit(1)
            .with_for_update()
            .execution_options(populate_existing=True)
        )

    async def _lookup(self, session: AsyncSession, event: FeedbackEvent) -> _Target:
        """Correlation without locks or side effects, to link events that apply nothing."""
        pmid = event.provider_message_id
        if pmid:
            attempt = await session.scalar(
                select(Attempt).where(Attempt.provider_message_id == pmid)
            )
            if attempt is not None:
                delivery = await session.get(Delivery, attempt.delivery_id)
                return _Target(delivery, attempt)
            delivery = await session.scalar(
                select(Delivery).where(Delivery.provider_message_id == pmid)
            )
            if delivery is not None:
                return _Target(delivery, None)
        if event.delivery_ref:
            delivery = await session.scalar(
                select(Delivery).where(_ref_condition(event.delivery_ref)).limit(1)
            )
            if delivery is not None:
                return _Target(delivery, None)
        return _Target()

    def _matches(self, event: FeedbackEvent, recipient_hash: str | None, target: _Target) -> bool:
        delivery = target.delivery
        assert delivery is not None
        if delivery.channel != event.channel:
            log.warning(
                "%s event for a %s delivery %s: ignored",
                event.channel,
                delivery.channel,
                delivery.id,
            )
            return False
        if recipient_hash is not None and delivery.recipient_hash != recipient_hash:
            # Another recipient of the same provider message (not one of ours): address-level
            # facts still count, the delivery is not about this address.
            return False
        return True

    # ---- state -------------------------------------------------------------------------

    async def _advance(
        self,
        session: AsyncSession,
        event: FeedbackEvent,
        classification: Classification,
        target: _Target,
        now: dt.datetime,
    ) -> str:
        outcome = classification.outcome
        delivery = target.delivery
        assert delivery is not None and outcome.state is not None
        attempt = target.attempt
        if attempt is not None:
            current = attempt.provider_status
            latest_number = await session.scalar(
                select(func.max(Attempt.number)).where(Attempt.delivery_id == delivery.id)
            )
            latest = attempt.number == latest_number
        else:
            current = provider_state(delivery.channel, delivery.status)
            latest = True
        retry_at = None
        backoff = self._backoff_for(delivery)
        if outcome.state == TRANSIENT:
            retry_at = next_attempt_at(
                backoff,
                delivery.attempts,
                now,
                expires_at=delivery.expires_at,
                rng=self._rng,
                # Feedback retries start at the feedback base: the provider already retried.
                retry_after=backoff.base_seconds,
            )
        result = step(
            delivery.channel,
            attempt_state=current,
            delivery_status=delivery.status,
            new_state=outcome.state,
            latest=latest,
            can_retry=retry_at is not None,
        )
        if result.disposition != APPLIED:
            return result.disposition
        error = _describe(event, classification) if outcome.state in _FAILURE_STATES else None
        if attempt is not None:
            attempt.provider_status = result.attempt_state
            if error is not None and event.error_code:
                attempt.error_code = event.error_code[:64]
        new_status = result.delivery_status
        if new_status is None:
            await session.flush()
            return APPLIED
        if new_status == RETRYING:
            assert retry_at is not None
            await session.flush()
            await dlog.schedule(
                await pg_of(session),
                delivery.id,
                at=retry_at,
                status=RETRYING,
                reason=outcome.name,
                last_error=error,
                now=now,
            )
        elif new_status == DEAD:
            await session.flush()
            exhausted = delivery.attempts >= backoff.max_attempts
            await dlog.dead_letter(
                await pg_of(session),
                delivery.id,
                reason="max_attempts" if exhausted else "expired",
                last_error=error,
                now=now,
            )
        else:
            if new_status in POSITIVE:
                if delivery.status in GATEWAY_STATES:
                    delivery.reason = None
            else:
                delivery.reason = outcome.name
                delivery.last_error = error
            delivery.status = new_status
            await session.flush()
            if result.cancel_retry:
                await dlog.unschedule(await pg_of(session), delivery.id)
        return APPLIED

    def _backoff_for(self, delivery: Delivery) -> Backoff:
        """The feedback backoff of a delivery: the attempt budget of its channel and
        priority (GATEWAY_RETRY_POLICIES), the feedback base and a longer cap."""
        priority = RANK_PRIORITY.get(delivery.priority_rank, "normal")
        policy = backoff_from_settings(self._retry, delivery.channel, priority)
        return Backoff(
            base_seconds=self._retry.feedback_base_seconds,
            max_seconds=max(
                policy.max_seconds,
                self._retry.feedback_base_seconds,
                self._settings.feedback_retry_max_seconds,
            ),
            max_attempts=policy.max_attempts,
        )

    async def _drain(self, session: AsyncSession, event: FeedbackEvent, target: _Target) -> int:
        """Apply events parked earlier for the same message or delivery (now correlated)."""
        rows = await store.parked(
            session,
            provider=event.provider,
            provider_message_id=event.provider_message_id,
            delivery_id=target.delivery_id,
        )
        return await self._apply_rows(session, rows) if rows else 0

    async def _apply_rows(self, session: AsyncSession, rows: Sequence[ProviderEvent]) -> int:
        applied = 0
        now = self._clock()
        for row in rows:
            event = store.rebuild(row)
            stored = OUTCOMES.get(str(row.details.get(store.OUTCOME_KEY)))
            classification = (
                Classification(stored, str(row.details.get(store.RULE_KEY)))
                if stored is not None
                else classify(event, self._settings.classification_overrides)
            )
            target = await self._correlate(session, event)
            if target.parked:
                if target.parked_delivery_id is not None and row.delivery_id is None:
                    row.delivery_id = target.parked_delivery_id
                continue
            if (
                row.recipient_hash is not None
                and target.delivery is not None
                and (target.delivery.recipient_hash != row.recipient_hash)
            ):
                disposition = IGNORED
            else:
                disposition = await self._advance(session, event, classification, target, now)
            row.disposition = disposition
            row.delivery_id = target.delivery_id
            row.attempt_id = target.attempt_id
            applied += 1
            EVENTS[(row.provider, disposition)] += 1
        await session.flush()
        return applied

    # ---- address-level effects ---------------------------------------------------------

    def _delivery_address(self, target: _Target) -> Address | None:
        delivery = target.delivery
        if delivery is None or not delivery.recipient_encrypted:
            return None
        try:
            key = self._protector.decrypt(delivery.recipient_encrypted)
        except InvalidToken:
            return None
        return Address(delivery.channel, key, key)

    async def _address_effects(
        self,
        session: AsyncSession,
        event: FeedbackEvent,
        outcome: Outcome,
        address: Address | None,
        target: _Target,
        now: dt.datetime,
    ) -> bool:
        if address is None or address.channel != event.channel:
            return False
        source = service.Source(
            "provider_event",
            event.provider_event_id,
            actor=event.provider,
            evidence=_evidence(event, outcome, now),
        )
        changed = False
        if outcome.suppression is not None and not (
            outcome.suppression == "sms_stop" and address.channel != "sms"
        ):
            _, created = await service.add(
                session, self._protector, address, reason=outcome.suppression, source=source
            )
            changed = created
        if outcome.soft_bounce:
            changed = await self._soft_bounce(session, address, source, now) or changed
        if outcome.name == "subscription":
            changed = await self._subscription(session, event, address, source, target) or changed
        return changed

    async def _soft_bounce(
        self, session: AsyncSession, address: Address, source: service.Source, now: dt.datetime
    ) -> bool:
        settings = self._settings
        address_hash = self._protector.hash(address.channel, address.key)
        # Serialize counting per address so two concurrent bounces cannot both miss the mark.
        await session.execute(select(func.pg_advisory_xact_lock(func.hashtext(address_hash))))
        count = await store.count_soft_bounces(
            session,
            address_hash,
            since=now - dt.timedelta(seconds=settings.soft_bounce_window_seconds),
        )
        if count < settings.soft_bounce_threshold:
            return False
        if await service.check(session, address.channel, address_hash, now=now) is not None:
            return False
        evidence = {**source.evidence, "soft_bounces": count}
        _, created = await service.add(
            session,
            self._protector,
            address,
            reason="soft_bounce",
            source=service.Source(source.type, source.id, actor=source.actor, evidence=evidence),
            expires_at=now + dt.timedelta(seconds=settings.soft_bounce_suppression_seconds),
        )
        return created

    async def _subscription(
        self,
        session: AsyncSession,
        event: FeedbackEvent,
        address: Address,
        source: service.Source,
        target: _Target,
    ) -> bool:
        """SES subscription management: opted-out topics become topic suppressions.

        Opt-ins are recorded only: lifting an unsubscribe is left to the operator, since
        it may have come from another source (one-click unsubscribe) for the same topic.
        """
        topics = [t for t in event.details.get("topics") or [] if isinstance(t, Mapping)]
        scopes = {str(t.get("topic")) for t in topics if t.get("status") == "OptOut"}
        if event.details.get("unsubscribe_all"):
            scopes |= {str(t.get("topic")) for t in topics} | {DEFAULT_TOPIC}
            if target.delivery is not None and target.delivery.topic:
                scopes.add(target.delivery.topic)
        changed = False
        for scope in sorted(scopes):
            try:
                service.validate_entry(address.channel, "unsubscribe", scope)
            except ValueError:
                log.warning("SES subscription event with an unusable topic name: skipped")
                continue
            _, created = await service.add(
                session, self._protector, address, reason="unsubscribe", source=source, scope=scope
            )
            changed = changed or created
        return changed

    async def _inbound(
        self,
        session: AsyncSession,
        event: FeedbackEvent,
        recipient_hash: str | None,
        now: dt.datetime,
    ) -> str:
        action = event.details.get("action")
        if action not in (twilio.STOP, twilio.START):
            return IGNORED
        if event.recipient is None or recipient_hash is None:
            log.warning("inbound %s keyword from an unusable sender number: recorded only", action)
            return IGNORED
        source = service.Source(
            "provider_event",
            event.provider_event_id,
            actor=event.provider,
            evidence={
                "message_sid": event.provider_message_id,
                "keyword": event.details.get("keyword"),
                "opt_out_type": event.details.get("opt_out_type"),
                "at": now.isoformat(),
            },
        )
        if action == twilio.STOP:
            await service.add(
                session, self._protector, event.recipient, reason="sms_stop", source=source
            )
            return APPLIED
        removed = await service.remove(
            session,
            event.channel,
            recipient_hash,
            reason=f"opt-in keyword {event.details.get('keyword')} received",
            source=source,
            only_reasons=["sms_stop"],
        )
        return APPLIED if removed else IGNORED

    async def _flag(self, flags: Sequence[tuple[str, str]]) -> None:
        for provider, rule in flags:
            PROVIDER_FLAGS[(provider, rule)] += 1
            log.warning("provider %s reported an account-level problem (%s)", provider, rule)
            if self._on_account_problem is None:
                continue
            try:
                await self._on_account_problem(provider, rule)
            except Exception:  # the feedback is stored; a failing alert must not undo that
                log.exception("account-problem hook failed for %s", provider)


def _ref_condition(ref: str) -> Any:
    """Match a delivery by the ref a payload carries: its id (Twilio ``d``, the SES tag) or
    its derived key (the SES header)."""
    by_key = Delivery.derived_key == ref[:64]
    try:
        return or_(Delivery.id == uuid.UUID(ref), by_key)
    except ValueError:
        return by_key


def _settle_candidate(attempts: Sequence[Attempt]) -> Attempt | None:
    """The attempt a keyed callback proves was sent: the latest whose outcome was unknown
    and that has no provider id yet."""
    for attempt in reversed(attempts):
        if attempt.status == AttemptStatus.UNKNOWN and attempt.provider_message_id is None:
            return attempt
    return None


def _describe(event: FeedbackEvent, classification: Classification) -> str:
    """A short, address-free description of a failure for `last_error`."""
    d = event.details
    parts = [event.provider, event.event_type]
    for key in ("bounce_type", "bounce_subtype", "status", "error_code", "feedback_type"):
        if d.get(key):
            parts.append(str(d[key]))
    return f"{' '.join(parts)} ({classification.outcome.name}; rule {classification.rule})"


def _evidence(event: FeedbackEvent, outcome: Outcome, now: dt.datetime) -> dict[str, Any]:
    d = event.details
    evidence: dict[str, Any] = {
        "event_type": event.event_type,
        "outcome": outcome.name,
        "provider_message_id": event.provider_message_id,
        "at": (event.occurred_at or now).isoformat(),
    }
    for key in ("bounce_type", "bounce_subtype", "status", "error_code", "feedback_type"):
        if d.get(key):
            evidence[key] = d[key]
    return evidence
