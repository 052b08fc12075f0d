"""Operator API of the dead-letter queue (scope `admin`).

`GET /v1/dlq` lists entries (filters: reason, channel, since/until on the dead-letter time,
state; cursor pagination), `GET /v1/dlq/{id}` shows one with its attempt history,
`POST /v1/dlq/{id}/redrive` and `POST /v1/dlq/redrive` (bulk, same filters) put deliveries
back on the queue with a fresh attempt budget (the dispatch checks suppression again), and
`DELETE /v1/dlq/{id}?reason=...` discards an entry, which stays as history.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.exceptions import ClientException, HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter, QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from retry import dlq
from retry.queue import DeliveryQueue
from suppression.api import SOME_TEXT, cursor_parameter

EntryState = Literal["open", "redriven", "discarded", "all"]

# OpenAPI: a query filter is text when given (Litestar would also allow JSON null).
_TEXT = {"one_of": None, "type": "string"}
_NOT_FOUND = ResponseSpec(None, description="No dead-letter entry has this id")
_CONFLICT = ResponseSpec(
    None, description="The entry is resolved already, or its delivery is no longer dead"
)


@dataclass
class DeadLetterView:
    """A dead-letter entry as listed."""

    id: uuid.UUID
    delivery_id: uuid.UUID
    channel: str
    reason: str
    last_error: str | None
    created_at: dt.datetime
    # open | redriven | discarded
    state: str
    resolution_reason: str | None
    resolved_by: str | None
    resolved_at: dt.datetime | None
    # The delivery's status now (a late callback may have moved a dead delivery on).
    delivery_status: str | None


@dataclass
class DeadLetterDetail(DeadLetterView):
    """One entry with the delivery's attempt history at the time it was dead-lettered."""

    attempt_history: list[dict[str, Any]]


@dataclass
class DeadLetterPage:
    """A page of entries, newest first; pass `next_cursor` as `cursor` for the next one."""

    items: list[DeadLetterView]
    next_cursor: str | None


MAX_NOTE = 1000
MAX_FILTER = 64
MAX_CURSOR = 512

Note = Annotated[str, msgspec.Meta(max_length=MAX_NOTE)]
FilterText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_FILTER)]


class RedriveRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Optional note stored with a redrive."""

    note: Note | None = None


class BulkRedriveRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which open entries to redrive: at least one filter, or `all: true` for every open
    entry (a request without either is refused, so an empty body cannot redrive everything)."""

    reason: FilterText | None = None
    channel: FilterText | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    all: bool = False
    note: Note | None = None


@dataclass
class BulkRedriveResult:
    """How many entries were redriven, and how many matching open entries were left open
    because their message's deadline (`expires_at`) has passed: redriven, they would expire
    again at once (discard them, or send a new message)."""

    redriven: int
    skipped_expired: int = 0


def entry_view(entry: dlq.Entry) -> DeadLetterView:
    """The API view of an entry."""
    r = entry.row
    return DeadLetterView(
        id=r.id,
        delivery_id=r.delivery_id,
        channel=r.channel,
        reason=r.reason,
        last_error=r.last_error,
        created_at=r.created_at,
        state=r.resolution or "open",
        resolution_reason=r.resolution_reason,
        resolved_by=r.resolved_by,
        resolved_at=r.resolved_at,
        delivery_status=entry.delivery_status,
    )


def entry_detail(entry: dlq.Entry) -> DeadLetterDetail:
    """The API view of an entry with its attempt history."""
    return DeadLetterDetail(**vars(entry_view(entry)), attempt_history=entry.row.attempt_history)


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    # A time without a zone is taken as UTC (every stored time is UTC); one that UTC cannot
    # represent is the client's mistake (400), not a database error.
    if value is None:
        return None
    try:
        return dlq.utc_time(value)
    except ValueError as exc:
        raise ClientException(str(exc)) from None


def _actor(request: Request[Any, Any, Any]) -> str:
    principal = getattr(request.state, "principal", None)
    key_id = getattr(principal, "key_id", None)
    return f"api_key:{key_id}" if key_id is not None else "api"


class DeadLetterController(Controller):
    """List, inspect, redrive and discard dead-lettered deliveries."""

    path = "/v1/dlq"
    tags = ["dlq"]
    opt = {"scope": "admin"}

    @get("/", summary="List dead-letter entries")
    async def list_entries(
        self,
        db_session: AsyncSession,
        delivery_queue: DeliveryQueue,
        reason: Annotated[
            str | None,
            Parameter(
                description=f"One of {', '.join(dlq.REASONS)} (others match nothing)",
                max_length=MAX_FILTER,
                schema_extra=_TEXT,
            ),
        ] = None,
        channel: Annotated[
            str | None,
            Parameter(
                description="email or sms (others match nothing)",
                max_length=MAX_FILTER,
                schema_extra=_TEXT,
            ),
        ] = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        entry_state: Annotated[EntryState, QueryParameter(name="state")] = "open",
        limit: Annotated[int, Parameter(ge=1, le=500)] = 50,
        cursor: Annotated[str | None, cursor_parameter(MAX_CURSOR)] = None,
    ) -> DeadLetterPage:
        """Entries newest first. `state` defaults to `open` (unresolved)."""
        f = dlq.DeadLetterFilter(reason, channel, _aware(since), _aware(until), entry_state)
        try:
            entries, next_cursor = await dlq.list_entries(
                db_session, delivery_queue, f, limit=limit, cursor=cursor
            )
        except dlq.BadCursor:
            raise ClientException("The cursor is not valid.") from None
        return DeadLetterPage([entry_view(e) for e in entries], next_cursor)

    @get(
        "/{entry_id:uuid}",
        summary="Show a dead-letter entry with its attempt history",
        responses={404: _NOT_FOUND},
    )
    async def show(
        self, entry_id: uuid.UUID, db_session: AsyncSession, delivery_queue: DeliveryQueue
    ) -> DeadLetterDetail:
        """One entry; 404 when there is none."""
        try:
            return entry_detail(await dlq.get_entry(db_session, delivery_queue, entry_id))
        except dlq.DeadLetterNotFound:
            raise NotFoundException(f"No dead-letter entry {entry_id}.") from None

    @post(
        "/{entry_id:uuid}/redrive",
        status_code=200,
        summary="Redrive one entry",
        responses={
            404: _NOT_FOUND,
            409: ResponseSpec(
                None,
                description="Resolved already, no longer dead, or its message has expired "
                "(it would expire again at once)",
            ),
        },
    )
    async def redrive(
        self,
        entry_id: uuid.UUID,
        request: Request[Any, Any, Any],
        db_session: AsyncSession,
        delivery_queue: DeliveryQueue,
        data: RedriveRequest | None = None,
    ) -> DeadLetterDetail:
        """Queue the delivery again with a fresh attempt budget; 409 when the entry is
        resolved already, its delivery is no longer dead, or its message's deadline has passed
        (`urn:problem:dlq-expired`: a redrive would expire again at once; discard it)."""
        async with _resolving(db_session, entry_id):
            entry = await dlq.redrive(
                db_session,
                delivery_queue,
                entry_id,
                actor=_actor(request),
                note=data.note if data else None,
            )
        return entry_detail(entry)

    @post(
        "/redrive",
        status_code=200,
        summary="Redrive every open entry matching the filters (or all: true)",
        responses={
            422: ResponseSpec(None, description="Neither a filter nor all: true was given"),
        },
    )
    async def redrive_bulk(
        self,
        request: Request[Any, Any, Any],
        db_session: AsyncSession,
        delivery_queue: DeliveryQueue,
        data: BulkRedriveRequest | None = None,
    ) -> BulkRedriveResult:
        """Redrive open entries (whose delivery is still dead) by reason, channel and time, or
        every one with `all: true`; committed in batches. Entries whose message has expired
        stay open and are counted in `skipped_expired`."""
        data = data or BulkRedriveRequest()
        has_filter = any(v is not None for v in (data.reason, data.channel, data.since, data.until))
        if not has_filter and not data.all:
            raise HTTPException(
                status_code=422,
                detail='Give a filter (reason, channel, since, until) or "all": true to '
                "redrive every open entry.",
                extra={"type": "urn:problem:redrive-filter-required"},
            )
        f = dlq.DeadLetterFilter(data.reason, data.channel, _aware(data.since), _aware(data.until))
        total = 0
        expired: set[uuid.UUID] = set()
        while True:
            n = await dlq.redrive_batch(
                db_session,
                delivery_queue,
                f,
                actor=_actor(request),
                note=data.note,
                expired=expired,
            )
            await db_session.commit()
            if n == 0:
                return BulkRedriveResult(total, len(expired))
            total += n

    @delete(
        "/{entry_id:uuid}",
        status_code=200,
        summary="Discard an entry (kept as history)",
        responses={404: _NOT_FOUND, 409: _CONFLICT},
    )
    async def discard(
        self,
        entry_id: uuid.UUID,
        request: Request[Any, Any, Any],
        db_session: AsyncSession,
        delivery_queue: DeliveryQueue,
        reason: Annotated[
            str,
            Parameter(
                min_length=1,
                max_length=1000,
                # Some text, not only white space (the handler checks it: documentation only).
                schema_extra={"pattern": SOME_TEXT},
            ),
        ],
    ) -> DeadLetterDetail:
        """Resolve the entry as discarded with a required `reason`; the delivery stays dead."""
        if not reason.strip():
            raise ClientException("A reason is required.")
        async with _resolving(db_session, entry_id):
            entry = await dlq.discard(
                db_session, delivery_queue, entry_id, actor=_actor(request), reason=reason
            )
        return entry_detail(entry)


@contextlib.asynccontextmanager
async def _resolving(session: AsyncSession, entry_id: uuid.UUID) -> AsyncIterator[None]:
    """Resolve one entry: commit on success; 404 for an unknown entry, 409 (rolled back) for
    one that is resolved already or whose delivery is no longer dead."""
    try:
        yield
    except dlq.DeadLetterNotFound:
        raise NotFoundException(f"No dead-letter entry {entry_id}.") from None
    except dlq.DeadLetterExpired as exc:
        await session.rollback()
        raise HTTPException(
            status_code=409, detail=str(exc), extra={"type": "urn:problem:dlq-expired"}
        ) from None
    except dlq.DeadLetterConflict as exc:
        await session.rollback()
        raise HTTPException(status_code=409, detail=str(exc)) from None
    await session.commit()


__all__ = ["DeadLetterController", "entry_detail", "entry_view"]
