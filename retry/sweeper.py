"""The sweeper: resolves work left half-done by a process that died.

* An attempt left `in_progress` longer than the stale threshold (the process died during the
  provider call) becomes `unknown`: the provider may or may not have sent it. Its delivery
  (if still in one of the gateway's own states) becomes `unknown` too and waits the settle
  window for a correlating callback; then the worker applies the unknown-outcome policy.
* A delivery a worker claimed (taken off the queue, status unchanged) and never dispatched,
  older than the threshold, is put back on the queue, due at once: nothing went out.
* A delivery left `sending` without an attempt in flight (an attempt ran, but its outcome
  never reached the delivery) becomes `unknown` and waits the settle window.

Every statement is a plain conditional UPDATE, so any number of sweepers can run at once.
"""

from __future__ import annotations

import datetime as dt
import logging

from sqlalchemy import exists, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry.queue import CLAIMABLE_STATUSES, attempts, deliveries
from suppression.db import utcnow

log = logging.getLogger("retry.sweeper")

# The delivery states a sweep may overwrite: the gateway's own, never a provider's verdict.
_OWN_STATES = ("queued", "sending", "retrying", "unknown")


async def sweep_stale(
    session_factory: async_sessionmaker[AsyncSession],
    *,
    older_than_seconds: float,
    now: dt.datetime | None = None,
    settle_seconds: float = 300.0,
) -> int:
    """Resolve stale `in_progress` attempts and abandoned claims; returns how many.

    Stale attempts become `unknown` (attempt and delivery), the delivery due again at
    `now + settle_seconds`. Abandoned claims are requeued as described in the module doc.
    """
    now = now or utcnow()
    cutoff = now - dt.timedelta(seconds=older_than_seconds)
    settle_at = now + dt.timedelta(seconds=settle_seconds)
    async with session_factory() as session, session.begin():
        stale = (
            await session.execute(
                update(attempts)
                .where(attempts.c.status == "in_progress", attempts.c.started_at < cutoff)
                .values(
                    status="unknown",
                    finished_at=now,
                    error_message="no outcome recorded (process stopped during the call?)",
                )
                .returning(attempts.c.delivery_id)
            )
        ).all()
        delivery_ids = list({row.delivery_id for row in stale})
        if delivery_ids:
            await session.execute(
                update(deliveries)
                .where(deliveries.c.id.in_(delivery_ids), deliveries.c.status.in_(_OWN_STATES))
                .values(
                    status="unknown",
                    next_attempt_at=settle_at,
                    last_error="outcome unknown: the attempt was left in progress",
                    updated_at=now,
                )
            )
            log.warning(
                "sweeper: %d stale in-progress attempt(s) marked unknown; settle until %s",
                len(stale),
                settle_at.isoformat(),
            )
        requeued = await _requeue_abandoned(session, cutoff, now, settle_at)
    return len(stale) + requeued


async def _requeue_abandoned(
    session: AsyncSession, cutoff: dt.datetime, now: dt.datetime, settle_at: dt.datetime
) -> int:
    d, a = deliveries, attempts
    no_call_in_flight = ~exists().where(a.c.delivery_id == d.c.id, a.c.status == "in_progress")
    # Claimed (off the queue, status unchanged) and never dispatched: nothing went out.
    untouched = (
        await session.execute(
            update(d)
            .where(
                d.c.status.in_(CLAIMABLE_STATUSES),
                d.c.next_attempt_at.is_(None),
                d.c.updated_at < cutoff,
                no_call_in_flight,
            )
            .values(next_attempt_at=now, updated_at=now)
            .returning(d.c.id)
        )
    ).all()
    # `sending` without an attempt in flight: an attempt ran but its outcome never reached
    # the delivery. Whether it went out is unknown.
    unrecorded = (
        await session.execute(
            update(d)
            .where(d.c.status == "sending", d.c.updated_at < cutoff, no_call_in_flight)
            .values(
                status="unknown",
                next_attempt_at=settle_at,
                last_error="outcome unknown: an attempt finished but was never recorded",
                updated_at=now,
            )
            .returning(d.c.id)
        )
    ).all()
    if untouched or unrecorded:
        log.warning(
            "sweeper: requeued %d abandoned claim(s), %d with an unknown outcome",
            len(untouched),
            len(unrecorded),
        )
    return len(untouched) + len(unrecorded)


__all__ = ["sweep_stale"]
