"""The retry worker: claims due deliveries and sends them through the send path's dispatch.

One round (`run_once`):

1. In one short transaction: pick up to `batch` due deliveries (`next_attempt_at <= now`,
   status queued/retrying/unknown), highest priority first, then oldest due time, with
   `FOR UPDATE SKIP LOCKED` (served by the partial index `ix_deliveries_due`), claim them by
   taking them off the queue (`next_attempt_at=NULL`, `updated_at` = claim time; the status
   stays, so the dispatch still sees a dispatchable delivery and sets `sending` itself when
   it writes the attempt), and settle the ones that must not be sent again: deadline passed
   -> dead letter `expired`; a non-transactional delivery whose outcome stayed unknown
   through the settle window -> dead letter `unknown_outcome` (unless configured to retry);
   attempt budget used up -> dead letter `max_attempts` (not for `queued` ones: a deferral
   or an account-level pause is not held to the budget, only to the deadline and to the
   maximum deferral age -> dead letter `max_deferral`). COMMIT.
2. Outside any transaction, call `dispatch(delivery_id)` for each remaining claimed row (a
   bounded number at a time, in priority order). The dispatch re-checks suppression and the
   deadline, makes one provider attempt, records it and reschedules or dead-letters itself.

Because claims are row locks taken with SKIP LOCKED and committed as "off the queue", any
number of workers in any number of processes can run side by side: each due row is claimed
by exactly one of them. A claim whose worker died before dispatching is put back on the
queue by the sweeper. The worker is handed `dispatch` by the composition root; `retry`
never imports `sender`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from retry.policy import backoff_from_settings, settle_reason
from retry.queue import DeliveryQueue, Due
from retry.settings import RetrySettings
from retry.sweeper import sweep_stale
from suppression.db import pg_connection, utcnow

log = logging.getLogger("retry.worker")

Dispatch = Callable[[uuid.UUID], Awaitable[str]]
Clock = Callable[[], dt.datetime]

# How long a cancelled worker lets provider calls already under way finish and record.
SHUTDOWN_GRACE_SECONDS = 10.0


@dataclass
class RoundResult:
    """What one round did."""

    claimed: int = 0
    dispatched: int = 0
    dead_lettered: int = 0


class Worker:
    """Claims due deliveries and dispatches them; `run` loops (with the sweeper) until cancelled."""

    def __init__(
        self,
        engine: AsyncEngine,
        queue: DeliveryQueue,
        dispatch: Dispatch,
        settings: RetrySettings,
        *,
        clock: Clock = utcnow,
        maintenance: Sequence[Callable[[], Awaitable[int]]] = (),
    ) -> None:
        self._engine = engine
        self._queue = queue
        self._dispatch = dispatch
        self._settings = settings
        self._clock = clock
        # Further periodic jobs handed in by the composition root (e.g. applying parked
        # provider events), run with the sweeper.
        self._maintenance = tuple(maintenance)

    async def run_once(self) -> RoundResult:
        """Claim one batch, settle what must not be sent, dispatch the rest; wait for them."""
        claimed, result = await self._claim(self._settings.worker_batch)
        if claimed:
            await self._dispatch_all(claimed)
            result.dispatched = len(claimed)
        return result

    async def drain(self) -> RoundResult:
        """Run rounds until nothing is due (for tests and one-shot runs)."""
        total = RoundResult()
        while True:
            result = await self.run_once()
            total.claimed += result.claimed
            total.dispatched += result.dispatched
            total.dead_lettered += result.dead_lettered
            if result.claimed == 0:
                return total

    async def sweep(self) -> int:
        """Resolve stale in-progress attempts and abandoned claims (see `retry.sweeper`),
        then run the maintenance jobs; returns how many rows all of them handled."""
        handled = await sweep_stale(
            self._engine,
            self._queue,
            older_than_seconds=self._settings.stale_in_progress_seconds,
            now=self._clock(),
            settle_seconds=self._settings.unknown_settle_seconds,
        )
        for job in self._maintenance:
            handled += await job()
        return handled

    async def run(self) -> None:
        """Loop until cancelled: rounds back to back while work is due, else poll; sweep
        periodically. A failing round (database down) is logged and retried after a pause."""
        s = self._settings
        sweep_every = min(max(s.stale_in_progress_seconds / 4, s.worker_poll_seconds), 60.0)
        next_sweep = 0.0
        log.info(
            "retry worker running (batch %d, concurrency %d)", s.worker_batch, s.worker_concurrency
        )
        while True:
            try:
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + sweep_every
                    await self.sweep()
                result = await self.run_once()
            except Exception:
                log.exception("retry worker round failed; pausing")
                await asyncio.sleep(max(s.worker_poll_seconds, 1.0))
                continue
            if result.claimed < s.worker_batch:
                await asyncio.sleep(s.worker_poll_seconds)

    async def _claim(self, limit: int) -> tuple[list[Due], RoundResult]:
        now = self._clock()
        result = RoundResult()
        to_send: list[Due] = []
        async with pg_connection(self._engine) as conn, conn.transaction():
            claimed = await self._queue.claim_due(conn, limit=limit, now=now)
            result.claimed = len(claimed)
            for item in claimed:
                reason = self._settle_reason(item, now)
                if reason is not None:
                    await self._queue.dead_letter(
                        conn, item.id, reason=reason, last_error=None, now=now
                    )
                    result.dead_lettered += 1
                    log.info("delivery %s dead-lettered before retry: %s", item.id, reason)
                else:
                    to_send.append(item)
        return to_send, result

    def _settle_reason(self, item: Due, now: dt.datetime) -> str | None:
        backoff = backoff_from_settings(self._settings, item.channel, item.priority)
        return settle_reason(
            backoff=backoff,
            attempts_made=item.attempts,
            now=now,
            expires_at=item.expires_at,
            settings=self._settings,
            outcome_unknown=item.outcome_unknown,
            transactional=item.transactional,
            held_to_budget=item.held_to_budget,
            deferred_since=item.deferred_since,
        )

    async def _dispatch_all(self, claimed: list[Due]) -> None:
        limit = asyncio.Semaphore(self._settings.worker_concurrency)
        tasks: set[asyncio.Task[None]] = set()
        started = 0
        try:
            for item in claimed:
                await limit.acquire()
                tasks.add(asyncio.create_task(self._dispatch_one(item, limit)))
                started += 1
            if tasks:
                # asyncio.wait, unlike gather, leaves the tasks running if we get cancelled.
                await asyncio.wait(tasks)
        except asyncio.CancelledError:
            await asyncio.shield(self._shutdown(claimed[started:], tasks))
            raise

    async def _shutdown(self, not_started: list[Due], tasks: set[asyncio.Task[None]]) -> None:
        # Rows claimed but not dispatched go back exactly as they were; calls under way may
        # finish and record their outcome (else the sweeper resolves them later).
        if not_started:
            await self._release(not_started)
        running = {t for t in tasks if not t.done()}
        if running:
            _, late = await asyncio.wait(running, timeout=SHUTDOWN_GRACE_SECONDS)
            for task in late:
                task.cancel()
        log.info(
            "retry worker stopped: %d claimed deliveries released, %d calls finished",
            len(not_started),
            len(running),
        )

    async def _release(self, items: list[Due]) -> None:
        async with pg_connection(self._engine) as conn:
            await self._queue.release(conn, items)

    async def _dispatch_one(self, item: Due, limit: asyncio.Semaphore) -> None:
        try:
            status = await self._dispatch(item.id)
            log.debug("delivery %s dispatched: %s", item.id, status)
        except Exception as exc:
            log.exception("dispatch of delivery %s failed", item.id)
            with contextlib.suppress(Exception):
                await self._recover(item, exc)
        finally:
            limit.release()

    async def _recover(self, item: Due, exc: Exception) -> None:
        # The dispatch raised. If it never started a provider attempt (the delivery is still
        # claimed: same status, off the queue), nothing went out: requeue it after the
        # deferral delay, without counting an attempt. If it did, the attempt is in progress
        # or recorded, and the sweeper resolves whatever is left.
        now = self._clock()
        at = now + dt.timedelta(seconds=self._settings.defer_seconds)
        async with pg_connection(self._engine) as conn:
            await self._queue.requeue_undispatched(
                conn, item, at=at, error=f"dispatch error: {type(exc).__name__}", now=now
            )


__all__ = ["Dispatch", "RoundResult", "Worker"]
