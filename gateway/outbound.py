"""Wiring of outbound webhooks: the push client, the pusher, the endpoint operations, and the
event feed with the API-key look-ups that decide each endpoint's visibility.

`webhooks.outbound` reads the event feed through `sender.events` and never touches the
API-key table: the key look-ups are handed in here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.keys import active_scopes
from gateway.settings import Settings
from suppression.crypto import AddressProtector
from suppression.db import pg_connection
from webhooks.outbound.client import PushClient
from webhooks.outbound.endpoints import Endpoints, KeyCheck
from webhooks.outbound.feed import EventFeed, SenderEventFeed
from webhooks.outbound.policy import EVENT_TYPES
from webhooks.outbound.pusher import OutboundWorker, Pusher


def key_check(engine: AsyncEngine) -> KeyCheck:
    """Whether an API key id names an active key (endpoints receive the events of one)."""

    async def is_active(key_id: uuid.UUID) -> bool:
        async with pg_connection(engine) as conn:
            return await active_scopes(conn, key_id) is not None

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
    feed = SenderEventFeed(protector, active_scopes)
    pusher = Pusher(engine, protector, s, feed, client)
    endpoints = Endpoints(
        protector, pusher, feed, event_types=EVENT_TYPES, key_is_active=key_check(engine)
    )
    return Outbound(client, pusher, endpoints, feed)
