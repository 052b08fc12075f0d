"""The feedback path after verification: correlate, advance, classify, act, store once.

`FeedbackIngestor` takes verified provider payloads (the HTTP endpoints and the sandbox
providers call it) and, per callback:

1. parses them into normalized events (one per recipient);
2. asks the event store, in one autocommit statement, which are stored already: an exact
   duplicate costs that one round trip and is answered ``duplicate``;
3. in one transaction on an asyncpg connection, for each new event: correlates it to an
   attempt and its delivery through the delivery log (`sender.log`), locking them: by
   provider message id, else by the delivery id / derived key the send attached (SES tag or
   header, Twilio ``d``). A callback for an attempt whose outcome is ``unknown`` settles it
   (``accepted`` with that provider id). Nothing known yet (the callback beat the send's
   commit): ``parked``, applied by `apply_parked` once the send recorded the provider id, or
   when the next event for the same message arrives; parked while the delivery's call is in
   flight, the delivery is flagged (`sender.log.note_parked`) so the send path applies it;
4. advances the attempt and the delivery by the pure state machine (`webhooks.state`):
   ``applied``, or ``duplicate``/``regression`` when it does not advance;
5. acts on the classification (`webhooks.classify`) of the *address*, whatever the
   delivery: suppression (hard bounce, complaint, STOP, invalid number, topic
   unsubscribes), soft-bounce counting, provider flagging. A transient failure of the
   delivery's latest attempt only schedules the bounded retry (`retry.policy.decide`), or
   dead-letters it when the budget or deadline is spent: no callback ever sends anything;
6. stores the event with what was done with it (`webhooks.store.insert`, ON CONFLICT DO
   NOTHING) and commits. A concurrent copy that got there first makes the insert return
   nothing: the transaction is rolled back and run again, and the copy is a ``duplicate``.

A ``delivered`` callback for a known attempt is thus: the duplicate check, BEGIN, the locked
look-up, the update of attempt and delivery, the insert, COMMIT.

Events with nothing to apply (engagement, not-spam complaints, unknown types, HELP) are
recorded as ``ignored``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Histogram
from sqlalchemy.ext.asyncio import AsyncEngine

from retry.policy import Action, Backoff, backoff_from_settings, decide
from retry.settings import RetrySettings
from sender import log as dlog
from sender.status import (
    BOUNCED,
    COMPLAINED,
    DEAD,
    FAILED,
    GATEWAY_STATES,
    QUEUED,
    RETRYING,
    AttemptStatus,
)
from suppression import service
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import Pg, pg_connection, utcnow
from suppression.normalize import Address
from webhooks import ses, store, twilio
from webhooks.classify import OUTCOMES, Classification, Outcome, classify
from webhooks.events import FeedbackEvent, storable
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

# The feedback path's metrics (exposed by the composition root's `/metrics`); labels are
# provider names, normalized event types, dispositions and rule keys only.
EVENTS = Counter(
    "gateway_provider_events_total",
    "Verified provider events, by normalized type and what was done with them.",
    ["provider", "event_type", "disposition"],
)
PROVIDER_FLAGS = Counter(
    "gateway_provider_flags_total",
    "Account-level problems reported by provider feedback.",
    ["provider", "rule"],
)
CALLBACK_LAG = Histogram(
    "gateway_callback_lag_seconds",
    "Time from a provider event (its own timestamp) to its receipt here.",
    ["provider", "event_type"],
    buckets=(0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0),
)

# Called after commit with (provider, rule) for account-level problems (e.g. the breaker).
AccountProblemHook = Callable[[str, str], Awaitable[None]]

# The topic an "unsubscribe from everything" of SES subscription management suppresses,
# besides every topic it lists (DESIGN "Scope": an unsubscribe defaults to `marketing`).
DEFAULT_TOPIC = "marketing"
_FAILURE_STATES = frozenset({BOUNCED, COMPLAINED, FAILED, TRANSIENT})
# A batch whose insert met a concurrent copy is run again; each run sees more copies stored.
_MAX_RUNS = 5


class _Raced(Exception):
    """An event was stored by a concurrent copy while this transaction applied it."""


@dataclass
class _Target:
    """Where an event lands: a delivery and (usually) one of its attempts, or nowhere yet."""

    delivery: dlog.DeliveryRow | None = None
    attempt: dlog.AttemptRow | None = None
    # The delivery's highest attempt number (None: no attempt).
    latest: int | None = None
    # Set when the event must wait (parked) although its delivery is already known;
    # `in_flight` when that is because the delivery's call is in flight.
    parked_delivery_id: uuid.UUID | None = None
    in_flight: bool = False

    @property
    def parked(self) -> bool:
        return self.delivery is None

    @property
    def delivery_id(self) -> uuid.UUID | None:
        return self.delivery.id if self.delivery is not None else self.parked_delivery_id

    @property
    def attempt_id(self) -> uuid.UUID | None:
        return self.attempt.id if self.attempt is not None else None


def _target(located: dlog.Located | None) -> _Target | None:
    if located is None:
        return None
    return _Target(located.delivery, located.attempt, located.latest_number)


@dataclass(frozen=True)
class _Prepared:
    """An incoming event with what is computed before any I/O."""

    event: FeedbackEvent
    classification: Classification
    recipient_hash: str | None
    details: dict[str, Any]


class FeedbackIngestor:
    """Stores, correlates and applies verified provider feedback (see the module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        protector: AddressProtector,
        settings: WebhookSettings,
        *,
        retry: RetrySettings,
        default_region: str = "US",
        on_account_problem: AccountProblemHook | None = None,
        clock: Callable[[], dt.datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
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
        prepared = [self._prepare(storable(event)) for event in events]
        flags: list[tuple[str, str, bool]] = []
        counts: list[tuple[str, str, str]] = []
        dispositions: list[str] = []
        async with pg_connection(self._engine) as pg:
            for _ in range(_MAX_RUNS):
                flags, counts = [], []
                seen = await store.seen(pg, [p.event for p in prepared])
                dispositions = [DUPLICATE if s.stored else "" for s in seen]
                ids = set()
                for i, p in enumerate(prepared):
                    # Two copies of one event in one payload: the second is a duplicate.
                    key = (p.event.provider, p.event.provider_event_id)
                    if key in ids:
                        dispositions[i] = DUPLICATE
                    ids.add(key)
                if all(dispositions):
                    break
                try:
                    async with pg.transaction():
                        for i, p in enumerate(prepared):
                            if not dispositions[i]:
                                dispositions[i] = await self._one(
                                    pg, p, seen[i].parked_waiting, flags, counts
                                )
                    break
                except _Raced:
                    continue
            else:  # pragma: no cover - every run stores or sees at least one more copy
                raise RuntimeError("feedback batch kept racing with concurrent copies")
        _count(counts)
        for p, disposition in zip(prepared, dispositions, strict=True):
            EVENTS.labels(p.event.provider, p.event.event_type, disposition).inc()
        await self._flag(flags)
        return dispositions

    async def record(self, event: FeedbackEvent, *, disposition: str = IGNORED) -> str:
        """Store an event that is not applied to anything (e.g. SNS confirmations).

        Returns `disposition`, or ``duplicate`` when it was stored before.
        """
        event = storable(event)
        async with pg_connection(self._engine) as pg:
            row_id = await store.insert(
                pg,
                event,
                recipient_hash=None,
                details={**event.details, store.CHANNEL_KEY: event.channel},
                disposition=disposition,
                payload_encrypted=store.encrypted_payload(self._protector, event),
                received_at=utcnow(),
            )
        result = disposition if row_id is not None else DUPLICATE
        EVENTS.labels(event.provider, event.event_type, result).inc()
        return result

    async def apply_parked(self, provider: str, provider_message_id: str) -> int:
        """Apply the events parked for a provider message id; how many were applied.

        The send path may call this after it committed the provider message id of an
        attempt; without parked events it costs one autocommit look-up.
        """
        return await self._apply_parked(provider=provider, provider_message_id=provider_message_id)

    async def apply_parked_for_delivery(self, delivery_id: uuid.UUID) -> int:
        """Apply the events parked for a delivery that was known but mid-send at the time.

        For the send path after it recorded an attempt's outcome and was told that feedback
        is parked for the delivery (`sender.log.note_parked`): a callback that arrived during
        the call then settles or advances that attempt.
        """
        return await self._apply_parked(delivery_id=delivery_id)

    async def _apply_parked(
        self,
        *,
        provider: str | None = None,
        provider_message_id: str | None = None,
        delivery_id: uuid.UUID | None = None,
    ) -> int:
        counts: list[tuple[str, str, str]] = []
        async with pg_connection(self._engine) as pg:
            if not await store.any_parked(
                pg,
                provider=provider,
                provider_message_id=provider_message_id,
                delivery_id=delivery_id,
            ):
                return 0
            async with pg.transaction():
                rows = await store.parked(
                    pg,
                    provider=provider,
                    provider_message_id=provider_message_id,
                    delivery_id=delivery_id,
                )
                applied = await self._apply_rows(pg, rows, counts)
        _count(counts)
        return applied

    async def sweep_parked(
        self, limit: int = 500, max_age_seconds: float = 86400.0, scan: int = 5000
    ) -> int:
        """Apply parked events that can be correlated now; how many were applied.

        Picks recent parked events (up to `scan` of them, oldest first) whose provider message
        id has become known, or whose delivery no longer has a call in flight (its attempt
        may now be settled). Closes the window where an event was parked while the send
        committed concurrently, and covers a send path that never called `apply_parked`; a
        periodic job may call it.
        """
        since = self._clock() - dt.timedelta(seconds=max_age_seconds)
        counts: list[tuple[str, str, str]] = []
        async with pg_connection(self._engine) as pg:
            candidates = await store.parked_since(pg, since, limit=scan)
            if not candidates:
                return 0
            pmids = sorted({c.provider_message_id for c in candidates if c.provider_message_id})
            known = await dlog.known_provider_ids(pg, pmids) if pmids else set()
            delivery_ids = sorted({c.delivery_id for c in candidates if c.delivery_id})
            idle = await dlog.without_call_in_flight(pg, delivery_ids) if delivery_ids else set()
            ready = [
                c.id for c in candidates if c.provider_message_id in known or c.delivery_id in idle
            ][:limit]
            if not ready:
                return 0
            async with pg.transaction():
                rows = await store.parked(pg, ids=ready, limit=limit)
                applied = await self._apply_rows(pg, rows, counts)
        _count(counts)
        return applied

    # ---- one event ---------------------------------------------------------------------

    def _prepare(self, event: FeedbackEvent) -> _Prepared:
        classification = classify(event, self._settings.classification_overrides)
        recipient_hash = (
            self._protector.hash(event.channel, event.recipient.key) if event.recipient else None
        )
        details: dict[str, Any] = {
            **event.details,
            store.CHANNEL_KEY: event.channel,
            store.OUTCOME_KEY: classification.outcome.name,
            store.RULE_KEY: classification.rule,
        }
        if event.delivery_ref:
            details[store.REF_KEY] = event.delivery_ref[:128]
        return _Prepared(event, classification, recipient_hash, details)

    async def _one(
        self,
        pg: Pg,
        prepared: _Prepared,
        parked_waiting: bool,
        flags: list[tuple[str, str, bool]],
        counts: list[tuple[str, str, str]],
    ) -> str:
        event, classification = prepared.event, prepared.classification
        recipient_hash = prepared.recipient_hash
        outcome = classification.outcome
        now = self._clock()
        received_at = utcnow()
        target = _Target()
        if outcome.name == "inbound":
            disposition = await self._inbound(pg, event, recipient_hash, now)
        else:
            if outcome.state is not None:
                target = await self._correlate(pg, event)
                if target.parked:
                    disposition = PARKED
                    if target.in_flight and target.parked_delivery_id is not None:
                        # Known delivery, call in flight: the send path applies it after
                        # recording the call's outcome.
                        await dlog.note_parked(pg, target.parked_delivery_id)
                elif not self._matches(event, recipient_hash, target):
                    disposition = IGNORED
                else:
                    # Events parked earlier for this message arrived first: apply them first.
                    if parked_waiting and await self._drain(pg, event, target, counts):
                        target = await self._correlate(pg, event)  # after their writes
                    disposition = await self._advance(pg, event, classification, target, now)
            else:
                target = await self._lookup(pg, event)
                disposition = IGNORED
            address = event.recipient or self._delivery_address(target)
            when = event.occurred_at or received_at
            changed = await self._address_effects(pg, event, outcome, address, target, now, when)
            if outcome.flag_provider:
                flags.append((event.provider, classification.rule, outcome.opens_circuit))
            if changed and disposition in (IGNORED, DUPLICATE, REGRESSION):
                disposition = APPLIED
        row_id = await store.insert(
            pg,
            event,
            recipient_hash=recipient_hash,
            details=prepared.details,
            disposition=disposition,
            payload_encrypted=await self._payload(pg, event, recipient_hash, target),
            received_at=received_at,
            delivery_id=target.delivery_id,
            attempt_id=target.attempt_id,
        )
        if row_id is None:
            raise _Raced
        if event.occurred_at is not None:
            lag = (received_at - event.occurred_at).total_seconds()
            CALLBACK_LAG.labels(event.provider, event.event_type).observe(max(0.0, lag))
        if disposition == PARKED:
            log.info(
                "parked %s event %s for unknown message %s",
                event.provider,
                event.event_type,
                event.provider_message_id,
            )
        return disposition

    async def _payload(
        self, pg: Pg, event: FeedbackEvent, recipient_hash: str | None, target: _Target
    ) -> str | None:
        """The encrypted raw payload to store, None for a person whose data was erased."""
        if event.raw is None:
            return None
        delivery = target.delivery
        erased = False
        if recipient_hash is not None and not (
            # Erasure deletes a delivery's ciphertext: a delivery to this address that still
            # has it proves the person was not erased, without asking the history.
            delivery is not None
            and delivery.recipient_hash == recipient_hash
            and delivery.recipient_encrypted
        ):
            erased = bool(await service.erased_hashes(pg, [(event.channel, recipient_hash)]))
        return None if erased else store.encrypted_payload(self._protector, event)

    # ---- correlation -------------------------------------------------------------------

    async def _correlate(self, pg: Pg, event: FeedbackEvent) -> _Target:
        """Find and lock the event's delivery (then attempt); settle an unknown attempt."""
        pmid = event.provider_message_id
        if pmid:
            found = _target(await dlog.by_provider_id(pg, pmid, lock=True))
            if found is not None:
                return found
        if not event.delivery_ref:
            return _Target()
        located = await dlog.by_ref(pg, event.delivery_ref, lock=True)
        if located is None:
            return _Target()
        delivery, attempts = located.delivery, located.attempts
        if not pmid:
            return _Target(delivery, located.attempt, located.latest_number)
        for attempt in attempts:
            # The send may have committed the id while we waited for the delivery lock.
            if attempt.provider_message_id == pmid:
                return _Target(delivery, attempt, located.latest_number)
        if delivery.provider_message_id == pmid:
            return _Target(delivery, None, located.latest_number)
        if any(a.status == AttemptStatus.IN_PROGRESS for a in attempts):
            # A call is in flight: the id may be its own. Wait for the send to record it.
            return _Target(parked_delivery_id=delivery.id, in_flight=True)
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
        await dlog.settle_attempt(pg, settle.id, delivery.id, pmid)
        settled = dataclasses.replace(
            settle, status=AttemptStatus.ACCEPTED.value, provider_message_id=pmid
        )
        if delivery.provider_message_id is None:
            delivery = dataclasses.replace(delivery, provider_message_id=pmid)
        return _Target(delivery, settled, located.latest_number)

    async def _lookup(self, pg: Pg, event: FeedbackEvent) -> _Target:
        """Correlation without locks or side effects, to link events that apply nothing."""
        pmid = event.provider_message_id
        if pmid:
            found = _target(await dlog.by_provider_id(pg, pmid, lock=False))
            if found is not None:
                return found
        if event.delivery_ref:
            located = await dlog.by_ref(pg, event.delivery_ref, lock=False)
            if located is not None:
                return _Target(located.delivery, None, located.latest_number)
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
        pg: Pg,
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
            latest = attempt.number == target.latest
        else:
            current = provider_state(delivery.channel, delivery.status)
            latest = True
        decision = None
        if outcome.state == TRANSIENT:
            backoff = self._backoff_for(delivery)
            decision = decide(
                # Transient, account-level (wait out the cool-down) or one recipient's.
                outcome.failure,
                backoff=backoff,
                attempts_made=delivery.attempts,
                now=now,
                expires_at=delivery.expires_at,
                settings=self._retry,
                # Feedback retries start at the feedback base: the provider already retried.
                retry_after=backoff.base_seconds,
                rng=self._rng,
            )
        result = step(
            delivery.channel,
            attempt_state=current,
            delivery_status=delivery.status,
            new_state=outcome.state,
            latest=latest,
            can_retry=decision is not None and decision.action in (Action.RETRY, Action.PAUSE),
        )
        if result.disposition != APPLIED:
            return result.disposition
        error = _describe(event, classification) if outcome.state in _FAILURE_STATES else None
        change = dlog.Advance(delivery.id)
        if attempt is not None:
            error_code = event.error_code[:64] if error is not None and event.error_code else None
            change = dlog.Advance(
                delivery.id, attempt.id, attempt_state=result.attempt_state, error_code=error_code
            )
        new_status = result.delivery_status
        if new_status == DEAD and decision is not None and decision.action is Action.FAIL:
            # A recipient the provider keeps refusing is that delivery's outcome, as at send
            # time: failed with the reason, not a dead letter for an operator.
            new_status = FAILED
        if new_status == RETRYING and decision is not None and decision.action is Action.PAUSE:
            # An account-level failure is not this delivery's: as at send time it waits
            # `queued` for the account cool-down, not held to the attempt budget (bounded by
            # its deadline and the maximum deferral age), while the provider is flagged.
            new_status = QUEUED
        if new_status in (RETRYING, QUEUED):
            assert decision is not None and decision.at is not None
            change = dataclasses.replace(
                change,
                status=new_status,
                reason=outcome.name,
                set_reason=True,
                last_error=error,
                next_attempt_at=decision.at,
            )
        elif new_status is not None and new_status != DEAD:
            change = dataclasses.replace(change, status=new_status, unschedule=result.cancel_retry)
            if new_status not in POSITIVE:
                change = dataclasses.replace(
                    change, reason=outcome.name, set_reason=True, last_error=error
                )
            elif delivery.status in GATEWAY_STATES:
                change = dataclasses.replace(change, reason=None, set_reason=True)
        if change.attempt_id is not None or change.status is not None:
            await dlog.apply_feedback(pg, change, now=now)
        if new_status == DEAD:
            assert decision is not None and decision.dead_reason is not None
            await dlog.dead_letter(
                pg, delivery.id, reason=decision.dead_reason, last_error=error, now=now
            )
        return APPLIED

    def _backoff_for(self, delivery: dlog.DeliveryRow) -> Backoff:
        """The feedback backoff of a delivery: the attempt budget of its channel and
        priority (GATEWAY_RETRY_POLICIES), the feedback base and a longer cap."""
        policy = backoff_from_settings(self._retry, delivery.channel, delivery.priority)
        return Backoff(
            base_seconds=self._retry.feedback_base_seconds,
            max_seconds=max(
                policy.max_seconds,
                self._retry.feedback_base_seconds,
                self._settings.feedback_retry_max_seconds,
            ),
            max_attempts=policy.max_attempts,
        )

    async def _drain(
        self, pg: Pg, event: FeedbackEvent, target: _Target, counts: list[tuple[str, str, str]]
    ) -> int:
        """Apply events parked earlier for the same message or delivery (now correlated)."""
        rows = await store.parked(
            pg,
            provider=event.provider,
            provider_message_id=event.provider_message_id,
            delivery_id=target.delivery_id,
        )
        return await self._apply_rows(pg, rows, counts) if rows else 0

    async def _apply_rows(
        self, pg: Pg, rows: Sequence[store.StoredEvent], counts: list[tuple[str, str, str]]
    ) -> int:
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
            target = await self._correlate(pg, event)
            if target.parked:
                if target.in_flight and target.parked_delivery_id is not None:
                    await dlog.note_parked(pg, target.parked_delivery_id)
                if target.parked_delivery_id is not None and row.delivery_id is None:
                    await store.finish(
                        pg,
                        row.id,
                        disposition=PARKED,
                        delivery_id=target.parked_delivery_id,
                        attempt_id=None,
                    )
                continue
            if (
                row.recipient_hash is not None
                and target.delivery is not None
                and (target.delivery.recipient_hash != row.recipient_hash)
            ):
                disposition = IGNORED
            else:
                disposition = await self._advance(pg, event, classification, target, now)
            await store.finish(
                pg,
                row.id,
                disposition=disposition,
                delivery_id=target.delivery_id,
                attempt_id=target.attempt_id,
            )
            applied += 1
            counts.append((row.provider, event.event_type, disposition))
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
        pg: Pg,
        event: FeedbackEvent,
        outcome: Outcome,
        address: Address | None,
        target: _Target,
        now: dt.datetime,
        when: dt.datetime,
    ) -> bool:
        if address is None or address.channel != event.channel:
            return False
        wants_suppression = outcome.suppression is not None and not (
            outcome.suppression == "sms_stop" and address.channel != "sms"
        )
        if not (wants_suppression or outcome.soft_bounce or outcome.name == "subscription"):
            return False
        source = service.Source(
            "provider_event",
            event.provider_event_id,
            actor=event.provider,
            evidence=_evidence(event, outcome, now),
        )
        changed = False
        if wants_suppression:
            assert outcome.suppression is not None
            _, created = await service.add(
                pg, self._protector, address, reason=outcome.suppression, source=source
            )
            changed = created
        if outcome.soft_bounce:
            changed = await self._soft_bounce(pg, address, source, now, when) or changed
        if outcome.name == "subscription":
            changed = await self._subscription(pg, event, address, source, target) or changed
        return changed

    async def _soft_bounce(
        self,
        pg: Pg,
        address: Address,
        source: service.Source,
        now: dt.datetime,
        when: dt.datetime,
    ) -> bool:
        settings = self._settings
        address_hash = self._protector.hash(address.channel, address.key)
        # Serialize counting per address so two concurrent bounces cannot both miss the mark.
        await store.lock_address(pg, address_hash)
        count = await store.count_soft_bounces(
            pg,
            address_hash,
            since=now - dt.timedelta(seconds=settings.soft_bounce_window_seconds),
            pending=when,  # this bounce: stored after it was applied
        )
        if count < settings.soft_bounce_threshold:
            return False
        if await service.check(pg, address.channel, address_hash, now=now) is not None:
            return False
        evidence = {**source.evidence, "soft_bounces": count}
        _, created = await service.add(
            pg,
            self._protector,
            address,
            reason="soft_bounce",
            source=service.Source(source.type, source.id, actor=source.actor, evidence=evidence),
            expires_at=now + dt.timedelta(seconds=settings.soft_bounce_suppression_seconds),
        )
        return created

    async def _subscription(
        self,
        pg: Pg,
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
                pg,
                self._protector,
                address,
                reason="unsubscribe",
                source=source,
                scope=scope,
            )
            changed = changed or created
        return changed

    async def _inbound(
        self,
        pg: Pg,
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
                pg, self._protector, event.recipient, reason="sms_stop", source=source
            )
            return APPLIED
        removed = await service.remove(
            pg,
            event.channel,
            recipient_hash,
            reason=f"opt-in keyword {event.details.get('keyword')} received",
            source=source,
            only_reasons=["sms_stop"],
        )
        return APPLIED if removed else IGNORED

    async def _flag(self, flags: Sequence[tuple[str, str, bool]]) -> None:
        for provider, rule, opens_circuit in flags:
            PROVIDER_FLAGS.labels(provider, rule).inc()
            log.warning("provider %s reported an account-level problem (%s)", provider, rule)
            if self._on_account_problem is None or not opens_circuit:
                continue
            try:
                await self._on_account_problem(provider, rule)
            except Exception:  # the feedback is stored; a failing alert must not undo that
                log.exception("account-problem hook failed for %s", provider)


def _count(counts: Sequence[tuple[str, str, str]]) -> None:
    """Count applied parked events: (provider, event type, disposition) each."""
    for provider, event_type, disposition in counts:
        EVENTS.labels(provider, event_type, disposition).inc()


def _settle_candidate(attempts: Sequence[dlog.AttemptRow]) -> dlog.AttemptRow | None:
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
