"""What the push side needs of the event feed (the outbox of `sender.events`): the `EventFeed`
protocol, and `SenderEventFeed`, its implementation on `sender.events` with an endpoint's
visibility.

Visibility follows the API key an endpoint was made for (`api_key_id`): an `admin` key sees
every event; another key the events of its own messages, and the suppression events if it
has scope `read`; an unknown or revoked key nothing (its endpoint's cursor moves on to the
feed's end, so nothing piles up for it).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sender import events
from suppression.crypto import AddressProtector
from suppression.db import Pg

# The scopes of an active API key, or None for an unknown or revoked one (the composition
# root answers from its key table, on the caller's connection).
KeyScopes = Callable[[Pg, uuid.UUID], Awaitable[frozenset[str] | None]]


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """An event of the feed as the fan-out sees it."""

    id: str
    type: str
    occurred_at: dt.datetime


class EventFeed(Protocol):
    """Reads of the event feed, on the caller's connection (inside its transaction)."""

    async def head(self, conn: Pg) -> str | None:
        """The cursor at the end of the feed now (a new endpoint starts there)."""
        ...

    async def read(
        self,
        conn: Pg,
        *,
        after: str | None,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[FeedEvent], str | None]:
        """Up to `limit` events after `after` that `api_key_id` may see (of `types`, or all),
        in feed order, and the cursor after them."""
        ...

    async def since(
        self,
        conn: Pg,
        *,
        since: dt.datetime,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        """Up to `limit` events that occurred at or after `since`, visible to `api_key_id`,
        oldest first (for a replay)."""
        ...

    async def bodies(self, conn: Pg, event_ids: Sequence[str]) -> dict[str, str]:
        """The JSON payloads of the events still in the feed, by id."""
        ...


class SenderEventFeed:
    """`EventFeed` on `sender.events` (the transactional outbox and its commit-ordered feed)."""

    def __init__(self, protector: AddressProtector, key_scopes: KeyScopes) -> None:
        self._protector = protector
        self._key_scopes = key_scopes

    async def head(self, conn: Pg) -> str | None:
        """The feed's present end."""
        return await events.current_cursor(conn)

    async def _visibility(self, conn: Pg, api_key_id: uuid.UUID) -> tuple[bool, bool] | None:
        """(sees every event, sees suppression events), or None for a key that sees nothing."""
        scopes = await self._key_scopes(conn, api_key_id)
        if scopes is None:
            return None
        admin = "admin" in scopes
        return admin, admin or "read" in scopes

    async def read(
        self,
        conn: Pg,
        *,
        after: str | None,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[FeedEvent], str | None]:
        """The next page of the feed as the endpoint's key sees it."""
        visibility = await self._visibility(conn, api_key_id)
        if visibility is None:
            return [], await events.current_cursor(conn)
        sees_all, sees_suppressions = visibility
        page, cursor = await events.read_feed(
            conn,
            after=after,
            limit=min(limit, events.MAX_LIMIT),
            client_id=None if sees_all else api_key_id,
            types=types,
            protector=self._protector,
        )
        return [
            FeedEvent(e.id, e.type, e.occurred_at)
            for e in page
            if sees_suppressions or e.message_owner is not None
        ], cursor

    async def since(
        self,
        conn: Pg,
        *,
        since: dt.datetime,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        """The events since a time as the endpoint's key sees them."""
        visibility = await self._visibility(conn, api_key_id)
        if visibility is None:
            return []
        sees_all, sees_suppressions = visibility
        found = await events.events_since(
            conn,
            since=since,
            limit=limit,
            client_id=None if sees_all else api_key_id,
            types=types,
            protector=self._protector,
        )
        return [
            FeedEvent(e.id, e.type, e.occurred_at)
            for e in found
            if sees_suppressions or e.message_owner is not None
        ]

    async def bodies(self, conn: Pg, event_ids: Sequence[str]) -> dict[str, str]:
        """The JSON bodies of the events still kept (retention may have pruned some)."""
        found = await events.events_by_ids(conn, event_ids, protector=self._protector)
        return {e.id: e.body().decode() for e in found}
