"""Waking the retry worker's lanes when deliveries became due, instead of waiting a poll.

An asynchronous acceptance (`Prefer: respond-async`) leaves its deliveries `queued`, due now;
an OTP among them must reach the provider within seconds. The worker's lanes (one per
priority, see `retry.worker`) therefore wait on a `Wakeup` rather than only sleeping their
poll interval:

* in process: `notify(priority)` sets that priority's event at once, so a worker running in
  the process that accepted the request claims it on its next loop turn (no round trip);
* across processes: PostgreSQL LISTEN/NOTIFY on channel `gateway_deliveries_due`, payload
  the priority rank. Notifications are coalesced: `notify` only marks the rank, and one
  `pg_notify` statement per `NOTIFY_INTERVAL_SECONDS` (on a pooled connection, after the
  accepting transaction committed) carries every rank marked meanwhile. That keeps NOTIFY out
  of the send claim: a NOTIFY takes a database-wide lock at commit, which would serialize the
  acceptance of every request. `listen()` holds one connection of its own per worker process
  (detached from the pool).

The poll interval stays as the safety net (a lost notification, a listener reconnecting,
deliveries that became due by time rather than by a new request: retries, deferrals).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from suppression.db import Pg, pg_connection

log = logging.getLogger("retry.wakeup")

CHANNEL = "gateway_deliveries_due"
NOTIFY_INTERVAL_SECONDS = 0.02
RANKS = {"high": 2, "normal": 1, "low": 0}
# How long a broken listener connection waits before it listens again.
RELISTEN_SECONDS = 1.0


class Wakeup:
    """Per-priority wake-up events, fed in process and (with an engine) through NOTIFY."""

    def __init__(
        self, engine: AsyncEngine | None = None, *, interval: float = NOTIFY_INTERVAL_SECONDS
    ) -> None:
        self._engine = engine
        self._interval = interval
        self._events = {rank: asyncio.Event() for rank in RANKS.values()}
        self._pending: set[int] = set()
        self._flusher: asyncio.Task[None] | None = None

    def notify(self, priority: str) -> None:
        """Deliveries of `priority` were just queued due now (after their commit)."""
        rank = RANKS.get(priority, 1)
        self._events[rank].set()
        if self._engine is None:
            return
        self._pending.add(rank)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    def set(self, rank: int) -> None:
        """Wake the lane of `rank` in this process only."""
        event = self._events.get(rank)
        if event is not None:
            event.set()

    def clear(self, rank: int) -> None:
        """Forget earlier wake-ups of `rank` (a lane calls it just before it claims)."""
        self._events[rank].clear()

    async def wait(self, rank: int, seconds: float) -> bool:
        """Wait until `rank` is woken or `seconds` passed; True when woken."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._events[rank].wait()
            return True
        return False

    async def _flush(self) -> None:
        await asyncio.sleep(self._interval)
        ranks, self._pending = sorted(self._pending), set()
        if not ranks or self._engine is None:
            return
        try:
            async with pg_connection(self._engine) as conn:
                await conn.execute(
                    "SELECT pg_notify($1, r) FROM unnest($2::text[]) AS r",
                    CHANNEL,
                    [str(r) for r in ranks],
                )
        except Exception as exc:
            # Other processes fall back to their poll interval; nothing is lost.
            log.warning("could not notify the workers (%s); they poll", type(exc).__name__)

    async def listen(self) -> None:
        """Hold a connection that LISTENs for other processes' notifications and wakes the
        lanes here; runs until cancelled, listening again after a broken connection."""
        if self._engine is None:
            return

        def received(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            for part in payload.split(","):
                with contextlib.suppress(ValueError):
                    self.set(int(part))

        while True:
            try:
                await self._listen_once(received)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("worker wake-up listener failed (%s); polling", type(exc).__name__)
            await asyncio.sleep(RELISTEN_SECONDS)

    async def _listen_once(self, received: Any) -> None:
        """LISTEN on a connection of its own until it closes (or the task is cancelled).

        The connection is opened by the engine's pool but detached from it, and terminated
        when done: a connection that listened (and might still be running its UNLISTEN when
        the task is cancelled) never goes back to the pool for another caller."""
        assert self._engine is not None
        closed = asyncio.Event()

        def terminated(_conn: Any) -> None:
            closed.set()

        fairy = await greenlet_spawn(self._engine.sync_engine.pool.connect)
        conn: Pg = fairy.driver_connection
        fairy.detach()
        try:
            conn.add_termination_listener(terminated)
            await conn.add_listener(CHANNEL, received)
            await closed.wait()
        finally:
            conn.terminate()


__all__ = ["CHANNEL", "Wakeup"]
