"""Wiring of outbound webhooks: the push client, the pusher, the endpoint operations, and the
adapters they need from other packages (the event feed; whether an API key is active).

`webhooks.outbound` reads the event feed only through its `EventFeed` protocol and never
touches the API-key table: both are handed in here.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.settings import Settings
from suppression.crypto import AddressProtector
from suppression.db import Pg, pg_connection
from webhooks.outbound.client import PushClient
from webhooks.outbound.endpoints import Endpoints, KeyCheck
from webhooks.outbound.feed import EventFeed, FeedEvent
from webhooks.outbound.policy import EVENT_TYPES
from webhooks.outbound.pusher import OutboundWorker, Pusher


class NoFeed:
    """An event feed without events (until the outbox is wired)."""

    async def head(self, conn: Pg) -> str | None:
        """No position."""
        return None

    async def read(
        self,
        conn: Pg,
        *,
        after: str | None,
        api_key_id: uuid.UUID,
        types: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[FeedEvent], str | None]:
        """Nothing new."""
        return [], after

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
        """Nothing."""
        return []

    async def bodies(self, conn: Pg, event_ids: Sequence[str]) -> dict[str, str]:
        """Nothing."""
        return {}


def key_check(engine: AsyncEngine) -> KeyCheck:
    """Whether an API key id names an active key (endpoints receive the events of one)."""

    async def is_active(key_id: uuid.UUID) -> bool:
        async with pg_connection(engine) as conn:
            found = await conn.fetchval(
                "SELECT 1 FROM api_keys WHERE id = $1 AND revoked_at IS NULL", key_id
            )
        return found is not None

    return is_active


@dataclass(frozen=True)
class Outbound:
    """The push side of one process."""

    client: PushClient
    pusher: Pusher
    endpoints: Endpoints
    feed: EventFeed

    def worker(self) -> OutboundWorker:
        """A push worker (fan-out and delivery) for this process."""
        return OutboundWorker(self.pusher, self.feed)


def build_outbound(
    settings: Settings, engine: AsyncEngine, protector: AddressProtector
) -> Outbound:
    """The push side for `settings`."""
    s = settings.outbound
    client = PushClient(
        allow_private=s.allow_private,
        connect_timeout=s.connect_timeout_seconds,
        read_timeout=s.read_timeout_seconds,
        max_connections=s.concurrency,
        ca_bundle=s.ca_bundle,
    )
    feed: EventFeed = NoFeed()
    pusher = Pusher(engine, protector, s, feed, client)
    endpoints = Endpoints(
        protector, pusher, feed, event_types=EVENT_TYPES, key_is_active=key_check(engine)
    )
    return Outbound(client, pusher, endpoints, feed)
