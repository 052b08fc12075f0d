"""Group commit for send claims: the claims of concurrent `POST /v1/messages` requests
(synchronous or `respond-async`) share one statement.

Each send request claims its message, deliveries and first attempts with one INSERT
statement (`sender.log.claim_many`), committed before any provider call, and on a small
machine its round trip (the socket write that wakes the database backend, the
statement's fixed cost, the commit's WAL flush) costs more than the rows it writes. A
`ClaimBatcher` lets at most `max_batches` statements run at a time (one by default);
claims that arrive while they are all busy wait and go together in the next one (up to
`max_size`). Under no load a claim runs at once, alone, so nothing waits for a timer; under
load the batches grow by themselves with the number of requests in flight.

A batch is one transaction: its claims commit together or not at all. When a batch fails
for any reason other than the database being unreachable (a row one request got wrong, a
deadlock with a concurrent batch), each of its claims is retried alone, so a request only
ever gets its own error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from sender import log as dlog
from suppression.db import is_database_unavailable, pg_connection

log = logging.getLogger(__name__)

# Statements in flight at once. One: while it runs, the next batch gathers. (Two kept the
# database busier but made each batch half as large; on 2 cores, at 16 connections, one
# process then accepted 3,500 requests a second at 0.27 ms of CPU each, against 4,300 at
# 0.23 ms with one.)
MAX_BATCHES = 1
# Claims per statement (a request has at most 100 recipients).
MAX_SIZE = 64


@dataclass(eq=False, slots=True)
class _Waiting:
    claim: dlog.Claim
    done: asyncio.Future[dlog.Verdicts | None]


class ClaimBatcher:
    """Runs `sender.log.claim_many` for the claims of concurrent requests (see the module
    docstring). One per process (its `SendService` holds it)."""

    def __init__(
        self, engine: AsyncEngine, *, max_batches: int = MAX_BATCHES, max_size: int = MAX_SIZE
    ) -> None:
        self._engine = engine
        self._max_batches = max_batches
        self._max_size = max_size
        self._waiting: list[_Waiting] = []
        self._running = 0
        # The runner tasks, referenced until they end (the loop holds tasks weakly).
        self._tasks: set[asyncio.Task[None]] = set()

    async def claim(self, claim: dlog.Claim) -> dlog.Verdicts | None:
        """Store one send request's claim; its verdicts, or None when its (client,
        Idempotency-Key) exists already (nothing of it was written).

        The claim is committed even when the awaiting request is cancelled meanwhile (a
        client that went away can replay its key and get the stored answer)."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(claim, loop.create_future())
        self._waiting.append(waiting)
        if self._running < self._max_batches:
            self._running += 1
            task = loop.create_task(self._run())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A cancelled request cancels only this future; the batch it is in carries on.
        return await waiting.done

    async def _run(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max_size]
                del self._waiting[: self._max_size]
                await self._claim(batch)
        finally:
            self._running -= 1

    async def _claim(self, batch: Sequence[_Waiting]) -> None:
        try:
            async with pg_connection(self._engine) as conn:
                found = await dlog.claim_many(conn, [w.claim for w in batch])
        except Exception as exc:
            if len(batch) == 1 or is_database_unavailable(exc):
                for w in batch:
                    _settle(w, exc=exc)
                return
            log.warning(
                "a batch of %d asynchronous claims failed (%s); claiming each alone",
                len(batch),
                type(exc).__name__,
            )
            await asyncio.gather(*(self._claim([w]) for w in batch))
            return
        for w, verdicts in zip(batch, found, strict=True):
            _settle(w, verdicts)


def _settle(
    waiting: _Waiting, verdicts: dlog.Verdicts | None = None, *, exc: BaseException | None = None
) -> None:
    if waiting.done.done():
        return
    if exc is not None:
        waiting.done.set_exception(exc)
    else:
        waiting.done.set_result(verdicts)


__all__ = ["MAX_BATCHES", "MAX_SIZE", "ClaimBatcher"]
