"""What the push side needs of the event feed (the outbox that `sender` writes), as a Protocol;
the composition root hands in the implementation, so this package reads the feed only
through it."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from suppression.db import Pg


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
        until_cursor: str | None,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> list[FeedEvent]:
        """Up to `limit` events that occurred at or after `since`, up to `until_cursor`,
        visible to `api_key_id` (for a replay)."""
        ...

    async def bodies(self, conn: Pg, event_ids: Sequence[str]) -> dict[str, str]:
        """The JSON payloads of the events still in the feed, by id."""
        ...
