"""HTTP route of the event feed: `GET /v1/events` (scope read).

The feed is `sender.events.read_feed` over HTTP: the events the key may see (its own
messages' and every suppression event; all of them for admin keys), in commit order, from
the `after` cursor on. A reader polls with the `next_cursor` it got and never misses an
event, whatever order concurrent transactions committed in.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import msgspec
from litestar import Controller, Request, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncEngine

from sender import events
from suppression.api import cursor_parameter
from suppression.crypto import AddressProtector
from suppression.db import pg_connection

DEFAULT_LIMIT = 100
# Comma-separated list of all twelve types, with room to spare.
MAX_TYPES_PARAM = 400

# An optional text parameter is stated as a plain string (not `oneOf` string/null), so that
# its length bounds sit on the string itself.
_TEXT: dict[str, Any] = {"one_of": None, "type": "string"}


class _Principal(Protocol):
    key_id: uuid.UUID
    scopes: frozenset[str]


@dataclass(frozen=True)
class FeedWiring:
    """What the feed needs from the composition root's services."""

    engine: AsyncEngine
    protector: AddressProtector


def provide_feed_wiring(state: State) -> FeedWiring:
    """The engine and protector of the process's services (wired by the composition root)."""
    return FeedWiring(engine=state.services.engine, protector=state.services.protector)


class EventItem(msgspec.Struct, kw_only=True):
    """One event: the payload a webhook push sends, too."""

    id: str
    type: events.EventType
    occurred_at: dt.datetime
    data: dict[str, Any]


class EventPage(msgspec.Struct, kw_only=True):
    """Answer to `GET /v1/events`: pass `next_cursor` as `after` to go on (it is always set;
    an empty page means nothing new yet, poll again with the same or the new cursor)."""

    items: list[EventItem]
    next_cursor: str


def _problem(type_: str, detail: str) -> HTTPException:
    return HTTPException(status_code=400, detail=detail, extra={"type": type_})


def parse_types(value: str | None) -> list[str] | None:
    """The `types` parameter (comma-separated event types) as a list; ValueError if unknown."""
    if value is None:
        return None
    wanted = [t.strip() for t in value.split(",") if t.strip()]
    if not wanted:
        raise ValueError("types must name at least one event type")
    events.check_types(wanted)
    return wanted


class EventsController(Controller):
    """The outbound event feed."""

    path = "/v1/events"
    tags = ["events"]
    dependencies = {"wiring": Provide(provide_feed_wiring, sync_to_thread=False)}

    @get(
        "/",
        opt={"scope": "read"},
        summary="The event feed (commit order, cursor)",
        description=(
            "Events of the key's own messages and every suppression event (admin keys: all "
            "events), in commit order, after the cursor `after` (omitted: from the oldest "
            "event kept). `types` is a comma-separated list of event types. A cursor stays "
            "valid for GATEWAY_EVENT_RETENTION_DAYS; keep using it with the same `types`."
        ),
        responses={
            400: ResponseSpec(
                None,
                description="A malformed cursor (urn:problem:invalid-cursor), an unknown event "
                "type (urn:problem:unknown-event-type) or a limit outside 1-1000",
            )
        },
    )
    async def feed(
        self,
        request: Request[Any, Any, Any],
        wiring: FeedWiring,
        after: Annotated[str | None, cursor_parameter(40)] = None,
        limit: Annotated[int, Parameter(ge=1, le=events.MAX_LIMIT)] = DEFAULT_LIMIT,
        types: Annotated[
            str | None,
            Parameter(
                description="Comma-separated event types, e.g. `delivery.bounced,"
                "suppression.added`",
                max_length=MAX_TYPES_PARAM,
                schema_extra=_TEXT,
            ),
        ] = None,
    ) -> EventPage:
        """The next page of the feed (see the route description)."""
        principal: _Principal = request.state.principal
        try:
            wanted = parse_types(types)
        except ValueError as exc:
            raise _problem("urn:problem:unknown-event-type", str(exc)) from None
        try:
            events.decode_cursor(after)
        except events.InvalidCursor as exc:
            raise _problem("urn:problem:invalid-cursor", str(exc)) from None
        async with pg_connection(wiring.engine) as conn:
            page, cursor = await events.read_feed(
                conn,
                after=after,
                limit=limit,
                client_id=None if "admin" in principal.scopes else principal.key_id,
                types=wanted,
                protector=wiring.protector,
            )
        return EventPage(
            items=[
                EventItem(id=e.id, type=e.type, occurred_at=e.occurred_at, data=e.data)  # type: ignore[arg-type]
                for e in page
            ],
            next_cursor=cursor,
        )
