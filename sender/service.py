"""The send service: validate, gate, claim idempotently, call the providers, answer.

Flow of `POST /v1/messages` (DESIGN flow 1), in round trips:

1. Validate and normalize every recipient; any invalid one -> 422 naming it, nothing stored.
2. The breaker and the rate limiter for all recipients at once (in process, or one Redis
   call per rate-limit key).
3. One statement, the claim (`sender.log.claim_many`, shared with the concurrent requests
   of this process by `sender.batching.ClaimBatcher`): the suppression verdicts, the message
   (INSERT ... ON CONFLICT DO NOTHING on (client, Idempotency-Key)), one delivery per
   recipient (`suppressed`, `queued` when deferred by step 2, else `sending`) and the first
   attempt of each sending one written `in_progress`. A conflict is a duplicate: different
   body fingerprint -> 422; first request still in flight -> 409; completed -> the stored
   answer with its original status code, nothing sent.
4. The provider calls, `GATEWAY_SEND_CONCURRENCY` at a time, no transaction or connection
   held; recipients beyond the first wave wait `queued` and get their attempt written with
   the previous wave's outcomes.
5. One statement (`Dispatcher.finish` -> `sender.log.record`): every attempt's outcome, the
   deliveries' new states, and the message completed with the first answers (no
   addresses) and its status code: 201 when every delivery has a final answer for its
   first attempt, 202 when any was deferred.

If this process dies after 3, the sweeper finds the `in_progress` attempts (unknown
outcome) and the worker takes the waiting deliveries when due.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from sender import log as dlog
from sender import status as st
from sender.batching import ClaimBatcher
from sender.dispatch import SUPPRESSION_HITS, Call, Dispatcher, current_request_id, timed_send
from sender.keys import derived_key, fingerprint
from sender.providers.base import OutgoingMessage
from sender.schemas import (
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    AttemptStatusName,
    AttemptView,
    Category,
    Channel,
    DeliveryAnswer,
    DeliveryStatusName,
    DeliveryView,
    EventView,
    MessageContent,
    MessageCreated,
    MessageView,
    Priority,
    SendMessage,
    SuppressionView,
)
from suppression.db import Pg, new_id, pg_connection, pg_of, utcnow
from suppression.models import Suppression
from suppression.normalize import Address, InvalidAddress, normalize, normalize_email

log = logging.getLogger("gateway.sender")

# Deliveries shown by GET /v1/messages/{id}: every one of a send (at most 100); the first ones
# of a campaign's message.
MAX_VIEW_DELIVERIES = 1000

# A send request or a campaign: the content and options they share are checked alike.
_Request = TypeVar("_Request", bound=MessageContent)

# Reads the provider events recorded for deliveries (the webhooks package owns them; the
# composition root hands this in): rows with id, delivery_id, provider, provider_event_id,
# event_type, provider_message_id, disposition, details, occurred_at, received_at.
EventsOf = Callable[[Pg, Sequence[uuid.UUID]], Awaitable[Sequence[Mapping[str, Any]]]]


@dataclass
class SendProblem(Exception):
    """A request the send API refuses; rendered as a problem document."""

    status: int
    type: str
    detail: str
    members: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SendAnswer:
    """The answer to a send: status code, document, whether it is a replay, and whether
    this request was handled asynchronously (accepted, deliveries left to the workers)."""

    status_code: int
    body: MessageCreated
    replayed: bool = False
    asynchronous: bool = False


# Told the priority name of deliveries just queued due now by an asynchronous acceptance
# (the composition root wakes the workers with it; see `retry.wakeup`). Must not block.
OnQueued = Callable[[str], None]


@dataclass(frozen=True)
class _Recipient:
    position: int
    raw: str
    address: Address


class SendService:
    """The send API's service: one instance per process (`services.sender`)."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        sessions: async_sessionmaker[AsyncSession],
        *,
        events_of: EventsOf | None = None,
        on_queued: OnQueued | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.sessions = sessions
        self.protector = dispatcher.protector
        self.config = dispatcher.config
        self.events_of = events_of
        self.on_queued = on_queued
        # Concurrent send requests share their claim statement (group commit).
        self._claims = ClaimBatcher(dispatcher.engine)

    # -- POST /v1/messages ------------------------------------------------------------------

    async def send(
        self,
        *,
        client_id: uuid.UUID,
        idempotency_key: str,
        request: SendMessage,
        raw_body: Any,
        prefer_async: bool = False,
    ) -> SendAnswer:
        """Run the whole send flow for one request (see the module docstring).

        `prefer_async` (the client sent `Prefer: respond-async`), or a marketing request
        while `marketing_async` is configured: the request is accepted asynchronously
        (`_accept`): 202 once the claim committed, the workers make the calls.
        """
        now = utcnow()
        recipients = self._recipients(request)
        content = self._content(request)
        request = self._check_rest(request, now)
        topic = request.topic or ("marketing" if request.category == "marketing" else None)
        channel = request.channel
        protector = self.protector
        message = dlog.NewMessage(
            id=new_id(),
            client_id=client_id,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint(raw_body),
            channel=channel,
            category=request.category,
            topic=topic,
            priority=request.priority,
            expires_at=request.expires_at,
            content_encrypted=protector.encrypt(json.dumps(content)),
            metadata=request.metadata or {},
            sender_identity=self.dispatcher.identity(channel, content.get("from")),
        )
        hashes = [protector.hash(channel, r.address.key) for r in recipients]
        provider = self.dispatcher.providers.get(channel)
        if prefer_async or (self.config.marketing_async and request.category == "marketing"):
            return await self._accept(message, recipients, hashes, provider is not None, now)
        safety_net = now + dt.timedelta(seconds=self.config.retry.stale_in_progress_seconds)
        ids = [new_id() for _ in recipients]
        keys = [
            derived_key(protector, client_id, idempotency_key, channel, r.address.key)
            for r in recipients
        ]
        # The breaker and the rate limiter first: the suppression check is part of the claim
        # (a suppression added while a limiter call was under way still counts). A recipient
        # found suppressed has spent a token for nothing.
        outgoing: list[OutgoingMessage | None] = [None] * len(recipients)
        deferred: list[str | None] = [None] * len(recipients)
        if provider is not None:
            prepared = [
                self.dispatcher.outgoing(
                    delivery_id=delivery_id,
                    derived_key=key,
                    channel=channel,
                    category=request.category,
                    topic=topic,
                    to=r.address.display,
                    content=content,
                )
                for r, delivery_id, key in zip(recipients, ids, keys, strict=True)
            ]
            outgoing = list(prepared)
            deferred = await self.dispatcher.gate_many(provider, prepared, request.priority)
        # The first `concurrency` calls get their attempt `in_progress` in the claim itself;
        # the others wait `queued` (due at the stale window, so the worker sends them if this
        # process dies) and get theirs just before their own call (`Dispatcher.finish`).
        # The claim takes the suppression verdicts in the same statement.
        first_wave = max(1, self.config.concurrency)
        news: list[dlog.NewDelivery] = []
        calls: list[Call] = []
        for i, r in enumerate(recipients):
            new = partial(
                dlog.NewDelivery,
                id=ids[i],
                position=r.position,
                recipient_hash=hashes[i],
                recipient_encrypted=protector.encrypt(r.address.display),
                derived_key=keys[i],
            )
            message_out = outgoing[i]
            if provider is None or message_out is None:
                # Nothing can send it here; the worker reports it when due.
                news.append(
                    new(
                        status=st.QUEUED,
                        reason=f"deferred: no {channel} provider in this process",
                        next_attempt_at=safety_net,
                    )
                )
            elif (reason := deferred[i]) is not None:
                at = self.dispatcher.defer_at(reason, now)
                news.append(new(status=st.QUEUED, reason=reason, next_attempt_at=at))
            else:
                call = Call(
                    delivery_id=ids[i],
                    attempt_id=new_id(),
                    number=1,
                    provider=provider,
                    message=message_out,
                    priority=request.priority,
                    attempts=1,
                    expires_at=request.expires_at,
                )
                if len(calls) < first_wave:
                    news.append(
                        new(status=st.SENDING, provider=provider.name, attempt_id=call.attempt_id)
                    )
                else:
                    news.append(new(status=st.QUEUED, next_attempt_at=safety_net))
                calls.append(call)
        verdicts = await self._claims.claim(
            dlog.Claim(
                message,
                news,
                priority_rank=st.PRIORITY_RANK[request.priority],
                now=now,
                request_id=current_request_id(),
            )
        )
        if verdicts is None:
            async with pg_connection(self.dispatcher.engine) as conn:
                return await self._duplicate(conn, client_id, idempotency_key, message.fingerprint)
        for status, reason, scope in verdicts.values():
            if status == st.SUPPRESSED:
                SUPPRESSION_HITS.labels(channel, reason or "", scope or "").inc()
        calls = [c for c in calls if verdicts[c.delivery_id][0] != st.SUPPRESSED]
        recorded = await self._send_waves(calls, first_wave, message.id)
        if recorded.response_code is None:
            # Another request completed it first (a stale-request takeover): its record wins.
            async with pg_connection(self.dispatcher.engine) as conn:
                stored = await dlog.message(conn, message.id)
                assert stored is not None
                return await self._replay(conn, stored)
        to = {d: r.address.display for d, r in zip(ids, recipients, strict=True)}
        body = MessageCreated(
            id=message.id,
            deliveries=[
                DeliveryAnswer(
                    id=d, to=to.get(d), status=cast(DeliveryStatusName, status), reason=reason
                )
                for d, status, reason in recorded.answers
            ],
        )
        return SendAnswer(recorded.response_code, body)

    async def _accept(
        self,
        message: dlog.NewMessage,
        recipients: Sequence[_Recipient],
        hashes: Sequence[str],
        sendable: bool,
        now: dt.datetime,
    ) -> SendAnswer:
        """Asynchronous acceptance: one statement (`sender.log.claim_many`, shared with the
        concurrent claims of this process by the `ClaimBatcher`) stores the message
        completed with its 202 answer and each delivery `queued` due now, or `suppressed` by
        its verdict (final at once). No limiter token is taken and no
        provider is called here: the workers claim the queued deliveries by priority and
        send them through `Dispatcher.dispatch` (which gates, re-checks suppression and the
        deadline). The workers are woken (`on_queued`) once the claim has committed."""
        protector = self.protector
        # Without a provider for the channel in this process the delivery waits like the
        # synchronous path's (due at the stale window, reason saying why).
        reason = None if sendable else f"deferred: no {message.channel} provider in this process"
        due = (
            now
            if sendable
            else now + dt.timedelta(seconds=self.config.retry.stale_in_progress_seconds)
        )
        news = [
            dlog.NewDelivery(
                id=new_id(),
                position=r.position,
                recipient_hash=h,
                recipient_encrypted=protector.encrypt(r.address.display),
                derived_key=derived_key(
                    protector,
                    message.client_id,
                    message.idempotency_key,
                    message.channel,
                    r.address.key,
                ),
                status=st.QUEUED,
                reason=reason,
                next_attempt_at=due,
            )
            for r, h in zip(recipients, hashes, strict=True)
        ]
        verdicts = await self._claims.claim(
            dlog.Claim(
                message,
                news,
                priority_rank=st.PRIORITY_RANK[message.priority],
                now=now,
                request_id=current_request_id(),
                complete=True,
            )
        )
        if verdicts is None:
            async with pg_connection(self.dispatcher.engine) as conn:
                return await self._duplicate(
                    conn, message.client_id, message.idempotency_key, message.fingerprint
                )
        for status, why, scope in verdicts.values():
            if status == st.SUPPRESSED:
                SUPPRESSION_HITS.labels(message.channel, why or "", scope or "").inc()
        if self.on_queued is not None and any(v[0] == st.QUEUED for v in verdicts.values()):
            self.on_queued(message.priority)
        body = MessageCreated(
            id=message.id,
            deliveries=[
                DeliveryAnswer(
                    id=d.id,
                    to=r.address.display,
                    status=cast(DeliveryStatusName, verdicts[d.id][0]),
                    reason=verdicts[d.id][1],
                )
                for d, r in zip(news, recipients, strict=True)
            ],
        )
        return SendAnswer(202, body, asynchronous=True)

    async def _send_waves(
        self, calls: Sequence[Call], wave: int, message_id: uuid.UUID
    ) -> dlog.Recorded:
        """Make the calls `wave` at a time: each wave's outcomes are recorded in the same
        transaction that writes the next wave's attempts; the last record completes the
        message. (A 100-recipient request neither waits for 100 sequential round trips nor
        holds 100 attempts `in_progress` that were never started.)"""
        pending = list(calls)
        current, pending = pending[:wave], pending[wave:]
        while True:
            done = await self._call_all(current)
            following, pending = pending[:wave], pending[wave:]
            recorded = await self.dispatcher.finish(
                done, complete=None if following else message_id, begin=following
            )
            if not following:
                return recorded
            current = [c for c in following if c.delivery_id in recorded.begun]

    async def _call_all(self, calls: Sequence[Call]) -> list[Call]:
        """Make one wave of provider calls at the same time."""
        if len(calls) == 1:
            call = calls[0]
            outcome = await timed_send(call.provider, call.message)
            return [dataclasses.replace(call, outcome=outcome)]

        async def one(call: Call) -> Call:
            return dataclasses.replace(call, outcome=await timed_send(call.provider, call.message))

        return list(await asyncio.gather(*(one(c) for c in calls)))

    def _recipients(self, request: SendMessage) -> list[_Recipient]:
        errors: list[dict[str, Any]] = []
        result: list[_Recipient] = []
        seen: dict[str, int] = {}
        for i, raw in enumerate(request.to):
            try:
                address = normalize(request.channel, raw, self.config.default_region, strict=True)
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

    def content_of(self, request: MessageContent) -> dict[str, Any]:
        """The content of a send or a campaign, checked (422 `SendProblem` otherwise)."""
        return self._content(request)

    def checked_options(self, request: _Request, now: dt.datetime) -> _Request:
        """The deadline and metadata of a send or a campaign checked (422 otherwise), with
        `expires_at` in UTC."""
        return self._check_rest(request, now)

    def _content(self, request: MessageContent) -> dict[str, Any]:
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

    def _check_rest(self, request: _Request, now: dt.datetime) -> _Request:
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

    async def _duplicate(
        self, conn: Pg, client_id: uuid.UUID, key: str, fingerprint: str
    ) -> SendAnswer:
        message = await dlog.message_by_key(conn, client_id, key)
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
            # deliveries show now (the retry worker carries on with the rest); if another
            # request closes it first, its record wins.
            log.warning("completing stale in-progress message %s", message.id)
            await dlog.record(conn, [], now=utcnow(), complete=message.id)
            completed = await dlog.message(conn, message.id)
            assert completed is not None
            return await self._replay(conn, completed, replayed=False)
        return await self._replay(conn, message)

    async def _replay(
        self, conn: Pg, message: dlog.MessageRow, *, replayed: bool = True
    ) -> SendAnswer:
        deliveries = await dlog.deliveries_of(conn, message.id)
        first = {a["id"]: a for a in message.first_answers or []}
        answers = []
        for d in deliveries:
            original = first.get(str(d.id), {})
            answers.append(
                DeliveryAnswer(
                    id=d.id,
                    to=self._to(d.recipient_encrypted),
                    status=original.get("status", d.status),
                    reason=original.get("reason", d.reason),
                )
            )
        code = message.response_code or 202
        body = MessageCreated(id=message.id, deliveries=answers)
        return SendAnswer(code, body, replayed=replayed)

    async def close(self) -> None:
        """Close the provider adapters (and cancel pending sandbox feedback)."""
        await self.dispatcher.close()

    def _to(self, recipient_encrypted: str | None) -> str | None:
        if recipient_encrypted is None:
            return None
        return self.protector.decrypt(recipient_encrypted)

    # -- GET /v1/messages/{id} --------------------------------------------------------------

    async def view(
        self, message_id: uuid.UUID, *, client_id: uuid.UUID, see_all: bool
    ) -> MessageView | None:
        """The message with its deliveries, attempts, provider events and suppressions.

        None when there is no such message, or it belongs to another client and the caller
        may not see every client's messages (`see_all`, i.e. an admin key).
        """
        async with self.sessions() as session:
            conn = await pg_of(session)
            message = await dlog.message(conn, message_id)
            if message is None or (message.client_id != client_id and not see_all):
                return None
            # A campaign's message may have a million deliveries: the view shows the first
            # ones (the campaign's counts are at GET /v1/campaigns/{id}).
            deliveries = await dlog.deliveries_of(conn, message_id, limit=MAX_VIEW_DELIVERIES + 1)
            truncated = len(deliveries) > MAX_VIEW_DELIVERIES
            deliveries = deliveries[:MAX_VIEW_DELIVERIES]
            ids = [d.id for d in deliveries]
            attempts: dict[uuid.UUID, list[dlog.AttemptRow]] = {i: [] for i in ids}
            for a in sorted(await dlog.attempts_of(conn, ids), key=lambda a: a.number):
                attempts[a.delivery_id].append(a)
            events: dict[uuid.UUID, list[EventView]] = {i: [] for i in ids}
            for row in await self.events_of(conn, ids) if self.events_of else []:
                events[row["delivery_id"]].append(
                    EventView(
                        id=row["id"],
                        provider=row["provider"],
                        provider_event_id=row["provider_event_id"],
                        event_type=row["event_type"],
                        provider_message_id=row["provider_message_id"],
                        disposition=row["disposition"],
                        details=row["details"] or {},
                        occurred_at=row["occurred_at"],
                        received_at=row["received_at"],
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
            channel=cast(Channel, message.channel),
            category=cast(Category, message.category),
            topic=message.topic,
            priority=cast(Priority, message.priority),
            expires_at=message.expires_at,
            metadata=message.metadata or {},
            state=message.state,
            response_code=message.response_code,
            created_at=message.created_at,
            completed_at=message.completed_at,
            deliveries_truncated=truncated,
            deliveries=[
                DeliveryView(
                    id=d.id,
                    to=self._to(d.recipient_encrypted),
                    status=cast(DeliveryStatusName, d.status),
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


def _attempt_view(a: dlog.AttemptRow) -> AttemptView:
    return AttemptView(
        number=a.number,
        status=cast(AttemptStatusName, a.status),
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
