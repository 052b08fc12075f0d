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

`run` (the long-running loop) works in three lanes, one per priority, each with its own
`worker_concurrency` dispatch slots:

* the `high` lane claims only `high` deliveries;
* the `normal` lane claims `high` and `normal` ones (highest first);
* the `low` lane claims every priority (highest first).

So a backlog of millions of `low` deliveries can fill the `low` lane's slots only: a `high`
delivery always finds its lane's slots (and, when idle, the other lanes help with it). A
lane claims no more rows than it has free slots (at most `worker_batch`), dispatches each
claimed row at once, and claims again as slots free up: claimed rows never wait behind a
slow call in memory. When its last claim was short, a lane waits for a wake-up
(`retry.wakeup.Wakeup`: in process when this process accepted deliveries, LISTEN/NOTIFY
across processes) or its poll interval, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from retry.policy import backoff_from_settings, settle_reason
from retry.queue import DeliveryQueue, Due
from retry.settings import RetrySettings
from retry.sweeper import sweep_stale
from retry.wakeup import Wakeup
from suppression.db import pg_connection, utcnow

log = logging.getLogger("retry.worker")

Dispatch = Callable[[uuid.UUID], Awaitable[str]]
_T = TypeVar("_T")
Clock = Callable[[], dt.datetime]

# How long a cancelled worker lets provider calls already under way finish and record.
SHUTDOWN_GRACE_SECONDS = 10.0


# The lanes: (name, lowest rank claimed, highest rank claimed); see the module docstring.
LANES: tuple[tuple[str, int, int], ...] = (("high", 2, 2), ("normal", 1, 2), ("low", 0, 2))


@dataclass
class _Lane:
    """One priority lane's dispatch slots and the calls it has under way."""

    name: str
    min_rank: int
    max_rank: int
    free: int
    freed: asyncio.Event
    tasks: set[asyncio.Task[None]]


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
        wakeup: Wakeup | None = None,
    ) -> None:
        self._engine = engine
        self._queue = queue
        self._dispatch = dispatch
        self._settings = settings
        self._clock = clock
        self._wakeup = wakeup or Wakeup()
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
        """Loop until cancelled: the three priority lanes claim and dispatch (see the module
        docstring), the sweeper runs periodically, and the wake-up listener hears other
        processes' notifications. Cancelling stops it gracefully: calls under way may finish
        and record their outcome (within `SHUTDOWN_GRACE_SECONDS`)."""
        s = self._settings
        log.info(
            "retry worker running (lanes high/normal/low, batch %d, concurrency %d per lane)",
            s.worker_batch,
            s.worker_concurrency,
        )
        lanes = [
            _Lane(name, low, high, s.worker_concurrency, asyncio.Event(), set())
            for name, low, high in LANES
        ]
        loops = [asyncio.create_task(self._lane(lane), name=f"lane-{lane.name}") for lane in lanes]
        loops.append(asyncio.create_task(self._sweep_loop(), name="sweeper"))
        loops.append(asyncio.create_task(self._wakeup.listen(), name="wakeup-listener"))
        try:
            # asyncio.wait, unlike gather, does not cancel the loops when `run` is cancelled:
            # each is cancelled exactly once below. A second cancellation could interrupt a
            # claim's rollback and return its connection to the pool inside a transaction.
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a loop only ends by raising
        finally:
            for task in loops:
                task.cancel()
            await asyncio.shield(self._stop(loops, lanes))

    async def _stop(self, loops: list[asyncio.Task[None]], lanes: list[_Lane]) -> None:
        await asyncio.gather(*loops, return_exceptions=True)
        running = {t for lane in lanes for t in lane.tasks if not t.done()}
        await self._finish_calls(running)

    async def _finish_calls(self, running: set[asyncio.Task[None]]) -> None:
        if running:
            _, late = await asyncio.wait(running, timeout=SHUTDOWN_GRACE_SECONDS)
            for task in late:
                task.cancel()
        log.info("retry worker stopped: %d calls finished", len(running))

    async def _sweep_loop(self) -> None:
        s = self._settings
        every = min(max(s.stale_in_progress_seconds / 4, s.worker_poll_seconds), 60.0)
        while True:
            try:
                await _uninterrupted(self.sweep())
            except Exception:
                log.exception("retry worker sweep failed")
            await asyncio.sleep(every)

    async def _lane(self, lane: _Lane) -> None:
        s = self._settings
        rank = lane.min_rank
        full = False
        while True:
            # After a full claim (a backlog), claim again once half the slots are free (one
            # claim statement per several calls); otherwise as soon as one is.
            need = max(1, s.worker_concurrency // 2) if full else 1
            while lane.free < need:
                lane.freed.clear()
                await lane.freed.wait()
            self._wakeup.clear(rank)
            asked = min(s.worker_batch, lane.free)
            claim = asyncio.ensure_future(self._claim(asked, lane.min_rank, lane.max_rank))
            try:
                items, result = await _uninterrupted(claim)
            except asyncio.CancelledError:
                # Stopped while claiming: the claim finished (see `_uninterrupted`); what it
                # took goes back on the queue exactly as it was.
                if claim.done() and not claim.cancelled() and claim.exception() is None:
                    await asyncio.shield(self._release(claim.result()[0]))
                raise
            except Exception:
                log.exception("retry worker claim failed (%s lane); pausing", lane.name)
                await asyncio.sleep(max(s.worker_poll_seconds, 1.0))
                continue
            for item in items:
                lane.free -= 1
                task = asyncio.create_task(self._lane_call(item, lane))
                lane.tasks.add(task)
                task.add_done_callback(lane.tasks.discard)
            full = result.claimed >= asked
            if not full:
                await self._wakeup.wait(rank, s.worker_poll_seconds)

    async def _lane_call(self, item: Due, lane: _Lane) -> None:
        try:
            await self._dispatch_guarded(item)
        finally:
            lane.free += 1
            lane.freed.set()

    async def _claim(
        self, limit: int, min_rank: int = 0, max_rank: int = 2
    ) -> tuple[list[Due], RoundResult]:
        now = self._clock()
        result = RoundResult()
        to_send: list[Due] = []
        async with pg_connection(self._engine) as conn, conn.transaction():
            claimed = await self._queue.claim_due(
                conn, limit=limit, now=now, min_rank=min_rank, max_rank=max_rank
            )
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
            await self._dispatch_guarded(item)
        finally:
            limit.release()

    async def _dispatch_guarded(self, item: Due) -> None:
        try:
            status = await self._dispatch(item.id)
            log.debug("delivery %s dispatched: %s", item.id, status)
        except Exception as exc:
            log.exception("dispatch of delivery %s failed", item.id)
            with contextlib.suppress(Exception):
                await self._recover(item, exc)

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


async def _uninterrupted(work: Awaitable[_T]) -> _T:
    """Await `work` so that cancelling the caller does not cut it short: a statement or
    transaction interrupted half-way (cancelled between BEGIN and COMMIT, or in a rollback)
    could return its pooled connection inside a transaction. On cancellation the work is
    finished first, then the cancellation goes on."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.wait({task})
        raise


__all__ = ["Dispatch", "RoundResult", "Worker"]
