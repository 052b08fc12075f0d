"""Delivery of events to endpoints: one try (`Pusher.push`), the fan-out from the event feed
and the worker loop (`OutboundWorker`).

Fan-out: each endpoint keeps a cursor into the event feed. In one transaction per endpoint
(the endpoint row locked with `SKIP LOCKED`, so one worker at a time fans out to it), the
worker reads the feed after the cursor with the endpoint's API key's visibility, adds one
pending delivery per subscribed event, and advances the cursor: an event is either fanned out
and the cursor past it, or neither, whatever process dies when.

Push: due deliveries are leased with `FOR UPDATE SKIP LOCKED` (a bounded number per endpoint)
in a short transaction, then pushed outside any transaction, a bounded number at a time per
process and per endpoint, and each try is recorded. A worker that dies after its claim leaves
a lease that runs out; another worker then pushes the event again (at-least-once, the same
`webhook-id`). A slow or dead endpoint holds at most its own share of the concurrency, and
this all runs as its own task, apart from the send path, the callbacks and the retry worker.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import pg_connection, utcnow
from webhooks.outbound import store
from webhooks.outbound.client import PushClient, TryResult
from webhooks.outbound.feed import EventFeed
from webhooks.outbound.policy import (
    ALL_EVENTS,
    next_attempt_at,
    should_disable,
    signing_secrets,
    subscribed,
)
from webhooks.outbound.settings import OutboundSettings
from webhooks.outbound.signing import signed_headers

log = logging.getLogger("gateway.webhooks.outbound")

Clock = Callable[[], dt.datetime]

# How long a cancelled worker lets pushes under way finish and record.
SHUTDOWN_GRACE_SECONDS = 5.0
# How long old tries and finished deliveries are kept.
RETENTION = dt.timedelta(days=30)
PRUNE_EVERY_SECONDS = 3600.0
# How often an endpoint's cursor is moved past a stretch of the feed with nothing for it.
CURSOR_IDLE_WRITE_SECONDS = 30.0


class Pusher:
    """One try of one leased delivery: sign, post, record (shared by the worker and the
    endpoints' `test`)."""

    def __init__(
        self,
        engine: AsyncEngine,
        protector: AddressProtector,
        settings: OutboundSettings,
        feed: EventFeed,
        client: PushClient,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.client = client
        self._protector = protector
        self._feed = feed
        self._clock = clock

    def now(self) -> dt.datetime:
        """The scheduling clock (injectable, so tests can move days ahead)."""
        return self._clock()

    def lease_until(self, now: dt.datetime) -> dt.datetime:
        """The end of a lease taken at `now`: long enough for a try, and for a wait behind
        the endpoint's other tries in this process."""
        return now + dt.timedelta(seconds=2 * self.client.budget_seconds + 5.0)

    async def push(self, item: store.Claimed) -> TryResult:
        """Try to deliver `item` once and record the outcome (the next try, `failed`, the
        endpoint's failure state and, after the window, its disabling)."""
        body = item.body
        if body is None:
            async with pg_connection(self.engine) as conn:
                body = (await self._feed.bodies(conn, [item.event_id])).get(item.event_id)
        if body is None:
            # The feed no longer holds it (retention or erasure): nothing left to send.
            result = TryResult(None, 0, "the event is no longer in the feed")
            await self._record(item, result, retry=False)
            return result
        now = self._clock()
        try:
            secrets = signing_secrets(
                self._protector.decrypt(item.secret_encrypted),
                self._protector.decrypt(item.previous_secret_encrypted)
                if item.previous_secret_encrypted
                else None,
                item.previous_secret_expires_at,
                now,
            )
        except InvalidToken:
            # GATEWAY_SECRET_KEYS lost the key the secret was encrypted with: a failed try
            # (retried on schedule, so restoring the key in time saves the event).
            result = TryResult(None, 0, "the signing secret cannot be decrypted (secret keys)")
            await self._record(item, result, retry=item.event_type != store.PING)
            return result
        # The signed timestamp is the real time of sending (receivers check it against their
        # clock), whatever the scheduling clock says.
        headers = signed_headers(
            secrets, event_id=item.event_id, timestamp=dt.datetime.now(dt.UTC), body=body
        )
        result = await self.client.post(item.url, headers, body)
        await self._record(item, result, retry=item.event_type != store.PING)
        return result

    async def _record(self, item: store.Claimed, result: TryResult, *, retry: bool) -> None:
        try:
            await self._record_try(item, result, retry=retry)
        except asyncpg.ForeignKeyViolationError:
            # The endpoint was deleted (with its deliveries) while this try was under way.
            log.info("webhook endpoint %s was deleted during a push", item.endpoint_id)

    async def _record_try(self, item: store.Claimed, result: TryResult, *, retry: bool) -> None:
        now = self._clock()
        schedule = self.settings.retry_schedule if retry else ()
        next_at = None if result.ok else next_attempt_at(item.attempts + 1, schedule, now)
        async with pg_connection(self.engine) as conn, conn.transaction():
            status = await store.record_try(
                conn,
                item,
                attempted_at=now,
                status_code=result.status_code,
                latency_ms=result.latency_ms,
                error=result.error,
                next_attempt_at=next_at,
                now=now,
            )
            if item.event_type == store.PING:
                # A test neither proves nor breaks an endpoint's health.
                pass
            elif result.ok:
                await store.note_success(conn, item.endpoint_id)
            else:
                state = await store.note_failure(conn, item.endpoint_id, now=now)
                if state is not None:
                    failing_since, enabled = state
                    window = self.settings.disable_after_seconds
                    if (
                        enabled
                        and should_disable(failing_since, now, window)
                        and await store.disable_failing(conn, item.endpoint_id, now=now)
                    ):
                        log.warning(
                            "webhook endpoint %s disabled: every try failed since %s",
                            item.endpoint_id,
                            failing_since.isoformat(),
                        )
        if status == store.FAILED:
            log.info(
                "webhook event %s failed for endpoint %s after %d tries: %s",
                item.event_id,
                item.endpoint_id,
                item.attempts + 1,
                result.error,
            )


class OutboundWorker:
    """Fans feed events out to endpoints and pushes due deliveries; `run` loops until
    cancelled, `drain` runs until nothing is due (tests, one-shot runs)."""

    def __init__(self, pusher: Pusher, feed: EventFeed) -> None:
        self._pusher = pusher
        self._feed = feed
        self._settings = pusher.settings
        self._engine = pusher.engine
        self._inflight: set[asyncio.Task[None]] = set()
        self._per_endpoint: collections.Counter[uuid.UUID] = collections.Counter()
        self._endpoint_limits: dict[uuid.UUID, asyncio.Semaphore] = {}
        self._wake = asyncio.Event()
        # When this worker last moved each endpoint's cursor (monotonic seconds).
        self._cursor_written: dict[uuid.UUID, float] = {}

    # -- fan-out ------------------------------------------------------------------------------

    async def fanout_once(self) -> int:
        """Read each enabled endpoint's new feed events (one batch each) into deliveries;
        returns how many deliveries were added."""
        async with pg_connection(self._engine) as conn:
            endpoint_ids = await store.enabled_endpoint_ids(conn)
        added = 0
        for endpoint_id in endpoint_ids:
            added += await self._fanout_endpoint(endpoint_id)
        if added:
            self._wake.set()
        return added

    async def _fanout_endpoint(self, endpoint_id: uuid.UUID) -> int:
        now = self._pusher.now()
        async with pg_connection(self._engine) as conn, conn.transaction():
            endpoint = await store.lock_for_fanout(conn, endpoint_id)
            if endpoint is None:
                return 0
            types = None if ALL_EVENTS in endpoint.events else endpoint.events
            events, cursor = await self._feed.read(
                conn,
                after=endpoint.feed_cursor,
                api_key_id=endpoint.api_key_id,
                types=types,
                limit=self._settings.fanout_batch,
            )
            if cursor == endpoint.feed_cursor:
                return 0
            if not events and time.monotonic() - self._cursor_written.get(endpoint_id, 0.0) < (
                CURSOR_IDLE_WRITE_SECONDS
            ):
                # Nothing new: the feed's horizon moved on, but writing the endpoint row every
                # round for that is not worth it (reading from a slightly older cursor is
                # cheap and skips nothing).
                return 0
            news = [
                store.NewDelivery(e.id, e.type, e.occurred_at)
                for e in events
                if subscribed(endpoint.events, e.type)
            ]
            added = await store.add_deliveries(conn, endpoint_id, news, now=now)
            await store.set_cursor(conn, endpoint_id, cursor)
        self._cursor_written[endpoint_id] = time.monotonic()
        return added

    # -- push ---------------------------------------------------------------------------------

    async def claim_and_start(self) -> int:
        """Lease what this process has room for and start pushing it; returns how many."""
        free = self._settings.concurrency - len(self._inflight)
        if free <= 0:
            return 0
        limit = self._settings.endpoint_concurrency
        busy = [e for e, n in self._per_endpoint.items() if n >= limit]
        now = self._pusher.now()
        async with pg_connection(self._engine) as conn, conn.transaction():
            claimed = await store.claim_due(
                conn,
                now=now,
                lease_until=self._pusher.lease_until(now),
                per_endpoint=limit,
                limit=free,
                exclude=busy,
            )
        for item in claimed:
            self._per_endpoint[item.endpoint_id] += 1
            task = asyncio.create_task(self._push_one(item))
            self._inflight.add(task)
            task.add_done_callback(self._done)
        return len(claimed)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()

    async def _push_one(self, item: store.Claimed) -> None:
        semaphore = self._endpoint_limits.setdefault(
            item.endpoint_id, asyncio.Semaphore(self._settings.endpoint_concurrency)
        )
        try:
            async with semaphore:
                await self._pusher.push(item)
        except Exception:
            # The lease runs out and the delivery is tried again (by this or another worker).
            log.exception("webhook push of event %s failed unexpectedly", item.event_id)
        finally:
            self._per_endpoint[item.endpoint_id] -= 1
            if self._per_endpoint[item.endpoint_id] <= 0:
                del self._per_endpoint[item.endpoint_id]
                self._endpoint_limits.pop(item.endpoint_id, None)

    async def drain(self) -> int:
        """Fan out and push until nothing is due; returns how many tries were made."""
        tries = 0
        while True:
            await self.fanout_once()
            started = await self.claim_and_start()
            tries += started
            if self._inflight:
                await asyncio.wait(set(self._inflight))
            elif started == 0:
                return tries

    # -- loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Fan out and push until cancelled; pushes under way get a short grace to finish
        (a lease that runs out is pushed again by any worker)."""
        s = self._settings
        log.info(
            "webhook push worker running (concurrency %d, %d per endpoint)",
            s.concurrency,
            s.endpoint_concurrency,
        )
        fanout = asyncio.create_task(self._fanout_loop())
        try:
            await self._push_loop()
        finally:
            fanout.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fanout
            running = set(self._inflight)
            if running:
                _, late = await asyncio.wait(running, timeout=SHUTDOWN_GRACE_SECONDS)
                for task in late:
                    task.cancel()
            log.info("webhook push worker stopped")

    async def _fanout_loop(self) -> None:
        next_prune = time.monotonic() + 60.0
        while True:
            try:
                added = await self.fanout_once()
                if time.monotonic() >= next_prune:
                    next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
                    async with pg_connection(self._engine) as conn:
                        await store.prune(conn, before=self._pusher.now() - RETENTION)
            except Exception:
                log.exception("webhook fan-out failed; pausing")
                await asyncio.sleep(max(self._settings.poll_seconds, 1.0))
                continue
            if not added:
                await asyncio.sleep(self._settings.poll_seconds)

    async def _push_loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                started = await self.claim_and_start()
            except Exception:
                log.exception("webhook claim failed; pausing")
                await asyncio.sleep(max(self._settings.poll_seconds, 1.0))
                continue
            if started and len(self._inflight) < self._settings.concurrency:
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.poll_seconds):
                    await self._wake.wait()
