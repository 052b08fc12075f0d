"""The send service: validate, claim idempotently, create deliveries, dispatch, answer.

Flow of `POST /v1/messages` (DESIGN flow 1):

1. Validate and normalize every recipient; any invalid one -> 422 naming it, nothing stored.
2. Claim the message: INSERT ... ON CONFLICT DO NOTHING on (client, Idempotency-Key). A
   conflict is a duplicate: different body fingerprint -> 422; first request still in
   flight -> 409; completed -> the stored answer with its original status code, nothing
   sent. In the same short transaction: one delivery per recipient (derived key, encrypted
   recipient), the suppressed ones marked `suppressed` at once.
3. Dispatch the others through `Dispatcher.dispatch` (the retry worker's path too), at most
   `concurrency` at a time, each with its own short transactions around the provider call.
4. Record the first answers (no addresses) and the status code on the message: 201 when
   every delivery has a final answer for its first attempt, 202 when any was deferred.

Deliveries are created with a safety-net `next_attempt_at` (the stale window): if this
process dies before dispatching them, the retry worker picks them up.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy import Column, DateTime, String, Text, Uuid, select, table, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from sender import status as st
from sender.dispatch import Dispatcher, FreshDelivery
from sender.keys import derived_key, fingerprint
from sender.models import Attempt, Delivery, Message
from sender.schemas import (
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    AttemptView,
    DeliveryAnswer,
    DeliveryView,
    EventView,
    MessageCreated,
    MessageView,
    SendMessage,
    SuppressionView,
)
from suppression import service as suppression
from suppression.db import utcnow
from suppression.models import Suppression
from suppression.normalize import Address, InvalidAddress, normalize, normalize_email

log = logging.getLogger("gateway.sender")

# The webhooks package owns `provider_events`; the send side only reads it, through this
# lightweight table clause (sender never imports webhooks).
provider_events = table(
    "provider_events",
    Column("id", Uuid),
    Column("provider", String),
    Column("provider_event_id", Text),
    Column("event_type", String),
    Column("provider_message_id", Text),
    Column("delivery_id", Uuid),
    Column("disposition", String),
    Column("details", JSONB),
    Column("occurred_at", DateTime(timezone=True)),
    Column("received_at", DateTime(timezone=True)),
)


@dataclass
class SendProblem(Exception):
    """A request the send API refuses; rendered as a problem document."""

    status: int
    type: str
    detail: str
    members: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SendAnswer:
    """The answer to a send: status code, document, and whether it is a replay."""

    status_code: int
    body: MessageCreated
    replayed: bool = False


@dataclass(frozen=True)
class _Recipient:
    position: int
    raw: str
    address: Address


class SendService:
    """The send API's service: one instance per process (in `services.extra["sender"]`)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.sessions = dispatcher.sessions
        self.protector = dispatcher.protector
        self.config = dispatcher.config

    # -- POST /v1/messages ------------------------------------------------------------------

    async def send(
        self,
        *,
        client_id: uuid.UUID,
        idempotency_key: str,
        request: SendMessage,
        raw_body: Any,
    ) -> SendAnswer:
        """Run the whole send flow for one request (see the module docstring)."""
        now = utcnow()
        recipients = self._recipients(request)
        content = self._content(request)
        request = self._check_rest(request, now)
        topic = request.topic or ("marketing" if request.category == "marketing" else None)
        answer_or_ids = await self._claim(
            client_id=client_id,
            idempotency_key=idempotency_key,
            request=request,
            fingerprint=fingerprint(raw_body),
            recipients=recipients,
            content=content,
            topic=topic,
            now=now,
        )
        if isinstance(answer_or_ids, SendAnswer):
            return answer_or_ids
        message_id, to_dispatch = answer_or_ids
        await self._dispatch_all(to_dispatch)
        return await self._finish(message_id)

    def _recipients(self, request: SendMessage) -> list[_Recipient]:
        errors: list[dict[str, Any]] = []
        result: list[_Recipient] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(request.to):
            try:
                address = normalize(request.channel, raw, self.config.default_region)
            except InvalidAddress as exc:
                errors.append({"index": i, "to": raw, "problem": exc.problem})
                continue
            if address.key in seen:
                errors.append(
                    {
                        "index": i,
                        "to": raw,
                        "problem": f"duplicate of recipient {seen[address.key]}",
                    }
                )
                continue
            seen[address.key] = i
            result.append(_Recipient(i, raw, address))
        if errors:
            names = ", ".join(repr(e["to"]) for e in errors[:5])
            raise SendProblem(
                422,
                "urn:problem:invalid-recipient",
                f"Invalid recipient(s): {names}{' ...' if len(errors) > 5 else ''}.",
                {"errors": errors},
            )
        return result

    def _content(self, request: SendMessage) -> dict[str, Any]:
        errors: list[dict[str, str]] = []

        def bad(field_name: str, problem: str) -> None:
            errors.append({"field": field_name, "problem": problem})

        content: dict[str, Any] = {}
        if request.channel == "email":
            if not request.subject or not request.subject.strip():
                bad("subject", "required for email")
            if not request.text and not request.html:
                bad("text", "email needs text and/or html")
            if request.body is not None:
                bad("body", "only for sms; email uses text/html")
            reply_to = (
                [request.reply_to] if isinstance(request.reply_to, str) else request.reply_to or []
            )
            for value in reply_to:
                try:
                    normalize_email(value)
                except InvalidAddress as exc:
                    bad("reply_to", f"{value!r}: {exc.problem}")
            if request.from_ is not None:
                try:
                    normalize_email(_bare_address(request.from_))
                except InvalidAddress as exc:
                    bad("from", exc.problem)
            content = {
                "subject": request.subject,
                "text": request.text,
                "html": request.html,
                "reply_to": reply_to,
                "from": request.from_,
            }
        else:
            if not request.body:
                bad("body", "required for sms")
            for name in ("subject", "text", "html", "reply_to"):
                if getattr(request, name) is not None:
                    bad(name, "only for email")
            content = {"body": request.body, "from": request.from_}
        if errors:
            raise SendProblem(
                422,
                "urn:problem:validation",
                "; ".join(f"{e['field']}: {e['problem']}" for e in errors),
                {"errors": errors},
            )
        return content

    def _check_rest(self, request: SendMessage, now: dt.datetime) -> SendMessage:
        """Check the deadline and metadata; returns the request with `expires_at` in UTC."""
        problems: list[dict[str, str]] = []
        expires_at = request.expires_at
        if expires_at is not None:
            if expires_at.tzinfo is None:
                problems.append({"field": "expires_at", "problem": "needs a UTC offset (RFC 3339)"})
            else:
                try:
                    # 9999-12-31T23:59:59-14:00 is a valid RFC 3339 time that UTC (and so
                    # the database driver) cannot represent.
                    expires_at = expires_at.astimezone(dt.UTC)
                except OverflowError:
                    problems.append({"field": "expires_at", "problem": "is out of range"})
                else:
                    if expires_at <= now:
                        problems.append({"field": "expires_at", "problem": "is in the past"})
        metadata = request.metadata or {}
        if len(metadata) > MAX_METADATA_KEYS:
            problems.append({"field": "metadata", "problem": f"at most {MAX_METADATA_KEYS} keys"})
        for key, value in metadata.items():
            if not key or len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                problems.append(
                    {
                        "field": "metadata",
                        "problem": f"keys 1-{MAX_METADATA_KEY} and values up to "
                        f"{MAX_METADATA_VALUE} characters",
                    }
                )
                break
        if problems:
            raise SendProblem(
                422,
                "urn:problem:validation",
                "; ".join(f"{p['field']} {p['problem']}" for p in problems),
                {"errors": problems},
            )
        return msgspec.structs.replace(request, expires_at=expires_at)

    async def _claim(
        self,
        *,
        client_id: uuid.UUID,
        idempotency_key: str,
        request: SendMessage,
        fingerprint: str,
        recipients: Sequence[_Recipient],
        content: dict[str, Any],
        topic: str | None,
        now: dt.datetime,
    ) -> SendAnswer | tuple[uuid.UUID, list[tuple[uuid.UUID, FreshDelivery | None]]]:
        message_id = uuid.uuid4()
        async with self.sessions() as session:
            inserted = await session.execute(
                insert(Message)
                .values(
                    id=message_id,
                    client_id=client_id,
                    idempotency_key=idempotency_key,
                    fingerprint=fingerprint,
                    state="in_progress",
                    channel=request.channel,
                    category=request.category,
                    topic=topic,
                    priority=request.priority,
                    expires_at=request.expires_at,
                    content_encrypted=self.protector.encrypt(json.dumps(content)),
                    metadata=request.metadata or {},
                    created_at=now,
                )
                .on_conflict_do_nothing(constraint="uq_messages_client_idempotency_key")
                .returning(Message.id)
            )
            if inserted.scalar() is None:
                await session.rollback()
                return await self._duplicate(session, client_id, idempotency_key, fingerprint)
            hashes = {
                r.address.key: self.protector.hash(request.channel, r.address.key)
                for r in recipients
            }
            hits = await suppression.check_many(
                session,
                request.channel,
                hashes.values(),
                category=request.category,
                topic=topic,
                now=now,
            )
            safety_net = now + dt.timedelta(seconds=self.config.retry.stale_in_progress_seconds)
            to_dispatch: list[tuple[uuid.UUID, FreshDelivery | None]] = []
            for r in recipients:
                address_hash = hashes[r.address.key]
                hit = hits.get(address_hash)
                delivery = Delivery(
                    id=uuid.uuid4(),
                    message_id=message_id,
                    position=r.position,
                    channel=request.channel,
                    recipient_hash=address_hash,
                    recipient_encrypted=self.protector.encrypt(r.address.display),
                    derived_key=derived_key(
                        self.protector, client_id, idempotency_key, request.channel, r.address.key
                    ),
                    status=st.SUPPRESSED if hit else st.QUEUED,
                    reason=hit.reason if hit else None,
                    suppression_id=hit.id if hit else None,
                    category=request.category,
                    topic=topic,
                    priority_rank=st.PRIORITY_RANK[request.priority],
                    expires_at=request.expires_at,
                    attempts=0,
                    next_attempt_at=None if hit else safety_net,
                    created_at=now,
                    updated_at=now,
                )
                session.add(delivery)
                if hit is None:
                    # The first dispatch reuses what this transaction just wrote and checked
                    # instead of reading it back before the rate limiter; it still re-checks
                    # everything (suppression included) under the row lock before the call.
                    to_dispatch.append((delivery.id, self.dispatcher.fresh(delivery, content)))
            await session.commit()
        return message_id, to_dispatch

    async def _duplicate(
        self, session: AsyncSession, client_id: uuid.UUID, key: str, fingerprint: str
    ) -> SendAnswer:
        message = await session.scalar(
            select(Message).where(Message.client_id == client_id, Message.idempotency_key == key)
        )
        if message is None:  # pragma: no cover - the conflicting row cannot vanish (no deletes)
            raise SendProblem(409, "urn:problem:idempotency-in-flight", "Please retry.")
        if message.fingerprint != fingerprint:
            raise SendProblem(
                422,
                "urn:problem:idempotency-key-reused",
                "This Idempotency-Key was already used with a different request body.",
            )
        if message.state != "completed":
            stale = utcnow() - dt.timedelta(seconds=self.config.retry.stale_in_progress_seconds)
            if message.created_at > stale:
                raise SendProblem(
                    409,
                    "urn:problem:idempotency-in-flight",
                    "A request with this Idempotency-Key is still being processed.",
                )
            # The first request's process died mid-way: close the message with what its
            # deliveries show now (the retry worker carries on with the rest).
            log.warning("completing stale in-progress message %s", message.id)
            return await self._finish(message.id)
        return await self._replay(session, message)

    async def _dispatch_all(
        self, deliveries: Sequence[tuple[uuid.UUID, FreshDelivery | None]]
    ) -> None:
        # Bounded concurrency: a 100-recipient request does not wait for 100 sequential
        # provider round trips, and does not open 100 connections either.
        gate = asyncio.Semaphore(max(1, self.config.concurrency))

        async def one(delivery_id: uuid.UUID, fresh: FreshDelivery | None) -> None:
            async with gate:
                try:
                    await self.dispatcher.dispatch(delivery_id, fresh=fresh)
                except Exception:
                    # Whatever state the delivery is left in, the worker or the sweeper
                    # carries on from it; the request still gets its answer.
                    log.exception("dispatch of delivery %s failed", delivery_id)

        await asyncio.gather(*(one(d, fresh) for d, fresh in deliveries))

    async def _finish(self, message_id: uuid.UUID) -> SendAnswer:
        async with self.sessions() as session:
            deliveries = await self._deliveries(session, message_id)
            deferred = any(d.status in st.DEFERRED for d in deliveries)
            code = 202 if deferred else 201
            # Completes the message only if nobody else did (a stale-request takeover may
            # race the original request); the loser answers with the winner's record.
            completed = await session.scalar(
                update(Message)
                .where(Message.id == message_id, Message.state != "completed")
                .values(
                    first_answers=[
                        {"id": str(d.id), "status": d.status, "reason": d.reason}
                        for d in deliveries
                    ],
                    response_code=code,
                    state="completed",
                    completed_at=utcnow(),
                )
                .returning(Message.id)
                .execution_options(synchronize_session=False)
            )
            if completed is None:
                message = await session.get(Message, message_id, populate_existing=True)
                assert message is not None
                return await self._replay(session, message)
            await session.commit()
            body = MessageCreated(
                id=message_id,
                deliveries=[
                    DeliveryAnswer(id=d.id, to=self._to(d), status=d.status, reason=d.reason)
                    for d in deliveries
                ],
            )
        return SendAnswer(code, body)

    async def _replay(self, session: AsyncSession, message: Message) -> SendAnswer:
        deliveries = await self._deliveries(session, message.id)
        first = {a["id"]: a for a in message.first_answers or []}
        answers = []
        for d in deliveries:
            original = first.get(str(d.id), {})
            answers.append(
                DeliveryAnswer(
                    id=d.id,
                    to=self._to(d),
                    status=original.get("status", d.status),
                    reason=original.get("reason", d.reason),
                )
            )
        code = message.response_code or 202
        return SendAnswer(code, MessageCreated(id=message.id, deliveries=answers), replayed=True)

    async def _deliveries(self, session: AsyncSession, message_id: uuid.UUID) -> list[Delivery]:
        rows = await session.scalars(
            select(Delivery)
            .where(Delivery.message_id == message_id)
            .order_by(Delivery.position, Delivery.created_at)
            .execution_options(populate_existing=True)
        )
        return list(rows)

    async def close(self) -> None:
        """Close the provider adapters (and cancel pending sandbox feedback)."""
        await self.dispatcher.close()

    def _to(self, delivery: Delivery) -> str | None:
        if delivery.recipient_encrypted is None:
            return None
        return self.protector.decrypt(delivery.recipient_encrypted)

    # -- GET /v1/messages/{id} --------------------------------------------------------------

    async def view(
        self, message_id: uuid.UUID, *, client_id: uuid.UUID, see_all: bool
    ) -> MessageView | None:
        """The message with its deliveries, attempts, provider events and suppressions.

        None when there is no such message, or it belongs to another client and the caller
        may not see every client's messages (`see_all`, i.e. an admin key).
        """
        async with self.sessions() as session:
            message = await session.get(Message, message_id)
            if message is None or (message.client_id != client_id and not see_all):
                return None
            deliveries = await self._deliveries(session, message_id)
            ids = [d.id for d in deliveries]
            attempts: dict[uuid.UUID, list[Attempt]] = {i: [] for i in ids}
            for a in await session.scalars(
                select(Attempt).where(Attempt.delivery_id.in_(ids)).order_by(Attempt.number)
            ):
                attempts[a.delivery_id].append(a)
            events: dict[uuid.UUID, list[EventView]] = {i: [] for i in ids}
            rows = await session.execute(
                select(provider_events)
                .where(provider_events.c.delivery_id.in_(ids))
                .order_by(provider_events.c.received_at, provider_events.c.id)
            )
            for row in rows:
                events[row.delivery_id].append(
                    EventView(
                        id=row.id,
                        provider=row.provider,
                        provider_event_id=row.provider_event_id,
                        event_type=row.event_type,
                        provider_message_id=row.provider_message_id,
                        disposition=row.disposition,
                        details=row.details or {},
                        occurred_at=row.occurred_at,
                        received_at=row.received_at,
                    )
                )
            suppression_ids = [d.suppression_id for d in deliveries if d.suppression_id]
            entries = {
                s.id: s
                for s in await session.scalars(
                    select(Suppression).where(Suppression.id.in_(suppression_ids))
                )
            }
        return MessageView(
            id=message.id,
            channel=message.channel,
            category=message.category,
            topic=message.topic,
            priority=message.priority,
            expires_at=message.expires_at,
            metadata=message.metadata_ or {},
            state=message.state,
            response_code=message.response_code,
            created_at=message.created_at,
            completed_at=message.completed_at,
            deliveries=[
                DeliveryView(
                    id=d.id,
                    to=self._to(d),
                    status=d.status,
                    reason=d.reason,
                    provider=d.provider,
                    provider_message_id=d.provider_message_id,
                    derived_key=d.derived_key,
                    attempts_made=d.attempts,
                    next_attempt_at=d.next_attempt_at,
                    last_error=d.last_error,
                    created_at=d.created_at,
                    updated_at=d.updated_at,
                    attempts=[_attempt_view(a) for a in attempts[d.id]],
                    events=events[d.id],
                    suppression=_suppression_view(d.suppression_id, entries),
                )
                for d in deliveries
            ],
        )


def _attempt_view(a: Attempt) -> AttemptView:
    return AttemptView(
        number=a.number,
        status=a.status,
        provider=a.provider,
        provider_message_id=a.provider_message_id,
        provider_status=a.provider_status,
        error_code=a.error_code,
        error=a.error_message,
        started_at=a.started_at,
        finished_at=a.finished_at,
    )


def _suppression_view(
    suppression_id: uuid.UUID | None, entries: dict[uuid.UUID, Suppression]
) -> SuppressionView | None:
    if suppression_id is None:
        return None
    entry = entries.get(suppression_id)
    if entry is None:
        # Removed since (the history keeps the details).
        return SuppressionView(id=suppression_id, active=False)
    return SuppressionView(
        id=entry.id,
        active=True,
        reason=entry.reason,
        scope=entry.scope,
        created_at=entry.created_at,
        expires_at=entry.expires_at,
    )


def _bare_address(value: str) -> str:
    """`Name <addr@example.com>` -> `addr@example.com` (SES accepts the display-name form)."""
    if value.endswith(">") and "<" in value:
        return value[value.rindex("<") + 1 : -1]
    return value
