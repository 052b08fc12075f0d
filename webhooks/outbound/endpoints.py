"""Managing endpoints: what the routes and the CLI do (create, change, rotate, test, replay,
list tries), with the checks that make bad input a clear refusal that changes nothing."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from suppression.crypto import AddressProtector
from suppression.db import pg_connection
from webhooks.outbound import store
from webhooks.outbound.client import TryResult
from webhooks.outbound.feed import EventFeed
from webhooks.outbound.policy import ALL_EVENTS, subscribed
from webhooks.outbound.pusher import Pusher
from webhooks.outbound.signing import new_secret
from webhooks.outbound.ssrf import UnsafeUrl, check_url

# Whether an API key may own an endpoint: True for an active key, False for an unknown or
# revoked one (the composition root answers from its key table).
KeyCheck = Callable[[uuid.UUID], Awaitable[bool]]

MAX_REPLAY = 10_000
"""The most events one replay sends again (a replay answers where it stopped)."""


class EndpointNotFound(LookupError):
    """No endpoint has this id."""


class InvalidEndpoint(ValueError):
    """The request cannot be applied; the message says why (a 422 for the caller)."""


@dataclass(frozen=True)
class TestResult:
    """What the `ping` of a test got."""

    event_id: str
    delivered: bool
    status_code: int | None
    latency_ms: int
    error: str | None


@dataclass(frozen=True)
class ReplayResult:
    """How many events a replay sends again, and where it stopped when it hit MAX_REPLAY
    (None: it covered everything since the time asked)."""

    replayed: int
    next_since: dt.datetime | None


class Endpoints:
    """The endpoint operations (one instance per process)."""

    def __init__(
        self,
        protector: AddressProtector,
        pusher: Pusher,
        feed: EventFeed,
        *,
        event_types: Sequence[str],
        key_is_active: KeyCheck,
    ) -> None:
        self._protector = protector
        self._pusher = pusher
        self._feed = feed
        self._engine = pusher.engine
        self._settings = pusher.settings
        self.event_types = tuple(event_types)
        self._key_is_active = key_is_active

    def _events(self, events: Sequence[str]) -> list[str]:
        if not events:
            raise InvalidEndpoint("events must list at least one event type, or '*'")
        unknown = [e for e in events if e != ALL_EVENTS and e not in self.event_types]
        if unknown:
            raise InvalidEndpoint(
                f"unknown event type(s) {', '.join(map(repr, unknown))}; choose from "
                f"{', '.join(self.event_types)} or '*'"
            )
        return [ALL_EVENTS] if ALL_EVENTS in events else list(dict.fromkeys(events))

    async def _check_url(self, url: str) -> None:
        try:
            await check_url(
                url,
                allow_private=self._settings.allow_private,
                time_limit=self._settings.connect_timeout_seconds,
            )
        except UnsafeUrl as exc:
            raise InvalidEndpoint(f"url: {exc}") from None

    async def create(
        self, *, url: str, events: Sequence[str], description: str, api_key_id: uuid.UUID
    ) -> tuple[store.EndpointRow, str]:
        """Create an endpoint; returns it with its signing secret (shown this once)."""
        subscribed_to = self._events(events)
        await self._check_url(url)
        if not await self._key_is_active(api_key_id):
            raise InvalidEndpoint(f"api_key_id: no active API key {api_key_id}")
        secret = new_secret()
        async with pg_connection(self._engine) as conn, conn.transaction():
            row = await store.create_endpoint(
                conn,
                url=url,
                description=description,
                events=subscribed_to,
                api_key_id=api_key_id,
                secret_encrypted=self._protector.encrypt(secret),
                feed_cursor=await self._feed.head(conn),
                now=self._pusher.now(),
            )
        return row, secret

    async def list_all(self) -> list[store.EndpointRow]:
        """Every endpoint."""
        async with pg_connection(self._engine) as conn:
            return await store.list_endpoints(conn)

    async def get(self, endpoint_id: uuid.UUID) -> store.EndpointRow:
        """One endpoint; raises `EndpointNotFound`."""
        async with pg_connection(self._engine) as conn:
            row = await store.get_endpoint(conn, endpoint_id)
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return row

    async def update(
        self,
        endpoint_id: uuid.UUID,
        *,
        url: str | None = None,
        description: str | None = None,
        events: Sequence[str] | None = None,
        enabled: bool | None = None,
    ) -> store.EndpointRow:
        """Change an endpoint (None: unchanged); enabling starts it at the feed's end."""
        subscribed_to = self._events(events) if events is not None else None
        if url is not None:
            await self._check_url(url)
        async with pg_connection(self._engine) as conn, conn.transaction():
            row = await store.update_endpoint(
                conn,
                endpoint_id,
                url=url,
                description=description,
                events=subscribed_to,
                enabled=enabled,
                cursor_on_enable=await self._feed.head(conn) if enabled else None,
                now=self._pusher.now(),
            )
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return row

    async def delete(self, endpoint_id: uuid.UUID) -> None:
        """Delete an endpoint with its deliveries and tries; raises `EndpointNotFound`."""
        async with pg_connection(self._engine) as conn:
            if not await store.delete_endpoint(conn, endpoint_id):
                raise EndpointNotFound(endpoint_id)

    async def rotate_secret(self, endpoint_id: uuid.UUID) -> tuple[store.EndpointRow, str]:
        """A new signing secret (returned this once); the old one keeps signing beside it for
        the overlap (24 hours)."""
        secret = new_secret()
        now = self._pusher.now()
        async with pg_connection(self._engine) as conn:
            row = await store.rotate_secret(
                conn,
                endpoint_id,
                secret_encrypted=self._protector.encrypt(secret),
                previous_expires_at=now
                + dt.timedelta(seconds=self._settings.secret_overlap_seconds),
                now=now,
            )
        if row is None:
            raise EndpointNotFound(endpoint_id)
        return row, secret

    async def test(self, endpoint_id: uuid.UUID) -> TestResult:
        """Push a `ping` event now (one try, no retry; disabled endpoints too) and say what
        the endpoint answered."""
        now = self._pusher.now()
        event_id = f"evt_ping_{uuid.uuid4().hex}"
        body = json.dumps(
            {
                "id": event_id,
                "type": store.PING,
                "occurred_at": now.isoformat(),
                "data": {"endpoint_id": str(endpoint_id)},
            },
            separators=(",", ":"),
        )
        async with pg_connection(self._engine) as conn:
            item = await store.add_leased(
                conn,
                endpoint_id,
                store.NewDelivery(event_id, store.PING, now, body),
                now=now,
                lease_until=self._pusher.lease_until(now),
            )
        if item is None:
            raise EndpointNotFound(endpoint_id)
        result: TryResult = await self._pusher.push(item)
        return TestResult(event_id, result.ok, result.status_code, result.latency_ms, result.error)

    async def attempts(
        self, endpoint_id: uuid.UUID, *, limit: int, before: dt.datetime | None = None
    ) -> list[store.AttemptRow]:
        """The endpoint's most recent tries, newest first; raises `EndpointNotFound`."""
        async with pg_connection(self._engine) as conn:
            if await store.get_endpoint(conn, endpoint_id) is None:
                raise EndpointNotFound(endpoint_id)
            return await store.list_attempts(conn, endpoint_id, limit=limit, before=before)

    async def replay(self, endpoint_id: uuid.UUID, *, since: dt.datetime) -> ReplayResult:
        """Send again every event since `since` that the endpoint subscribes to and its key
        may see, delivered or not (those it never got too, e.g. while it was disabled), up to
        MAX_REPLAY of them; raises `EndpointNotFound`."""
        now = self._pusher.now()
        async with pg_connection(self._engine) as conn, conn.transaction():
            endpoint = await store.get_endpoint(conn, endpoint_id)
            if endpoint is None:
                raise EndpointNotFound(endpoint_id)
            events = await self._feed.since(
                conn,
                since=since,
                api_key_id=endpoint.api_key_id,
                types=None if ALL_EVENTS in endpoint.events else endpoint.events,
                limit=MAX_REPLAY + 1,
            )
            next_since = None
            if len(events) > MAX_REPLAY:
                next_since = events[MAX_REPLAY].occurred_at
                events = events[:MAX_REPLAY]
            # First what it already has, then what it never got (now pending as well).
            again = await store.replay(conn, endpoint_id, since=since, until=next_since, now=now)
            news = [
                store.NewDelivery(e.id, e.type, e.occurred_at)
                for e in events
                if subscribed(endpoint.events, e.type)
            ]
            added = await store.add_deliveries(conn, endpoint_id, news, now=now)
        return ReplayResult(again + added, next_since)
