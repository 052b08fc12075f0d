"""The sweeper: resolves work left half-done by a process that died.

* An attempt left `in_progress` longer than the stale threshold (the process died during the
  provider call) becomes `unknown`: the provider may or may not have sent it. Its delivery
  (if still in one of the gateway's own states) becomes `unknown` too and waits the settle
  window for a correlating callback; then the worker applies the unknown-outcome policy.
* A delivery a worker claimed (taken off the queue, status unchanged) and never dispatched,
  older than the threshold, is put back on the queue, due at once: nothing went out.
* A delivery left `sending` without an attempt in flight (an attempt ran, but its outcome
  never reached the delivery) becomes `unknown` and waits the settle window.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from retry.queue import DeliveryQueue
from suppression.db import pg_connection, utcnow

log = logging.getLogger("retry.sweeper")


async def sweep_stale(
    engine: AsyncEngine,
    queue: DeliveryQueue,
    *,
    older_than_seconds: float,
    now: dt.datetime | None = None,
    settle_seconds: float = 300.0,
) -> int:
    """Resolve stale `in_progress` attempts and abandoned claims; returns how many.

    Stale attempts become `unknown` (attempt and delivery), the delivery due again at
    `now + settle_seconds`. Abandoned claims are requeued as described in the module doc.
    The statements belong to the delivery log (`queue`); they are plain conditional
    UPDATEs, so any number of sweepers can run at once.
    """
    now = now or utcnow()
    cutoff = now - dt.timedelta(seconds=older_than_seconds)
    settle_at = now + dt.timedelta(seconds=settle_seconds)
    async with pg_connection(engine) as conn:
        stale, untouched, unrecorded = await queue.sweep_stale(
            conn, cutoff=cutoff, now=now, settle_at=settle_at
        )
    if stale:
        log.warning(
            "sweeper: %d stale in-progress attempt(s) marked unknown; settle until %s",
            stale,
            settle_at.isoformat(),
        )
    if untouched or unrecorded:
        log.warning(
            "sweeper: requeued %d abandoned claim(s), %d with an unknown outcome",
            untouched,
            unrecorded,
        )
    return stale + untouched + unrecorded


__all__ = ["sweep_stale"]
