"""The sweeper: stale in-progress attempts become unknown; abandoned claims are requeued."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import select

from gateway.services import Services
from retry.sweeper import sweep_stale
from suppression.db import utcnow
from tests.retry.helpers import delivery_row, insert_deliveries
from tests.support.tables import attempts, deliveries


async def _attempt(
    services: Services, delivery_id: uuid.UUID, started: dt.datetime, status: str
) -> uuid.UUID:
    ident = uuid.uuid4()
    async with services.sessions() as s, s.begin():
        await s.execute(
            attempts.insert().values(
                id=ident,
                delivery_id=delivery_id,
                number=1,
                status=status,
                provider="stub",
                started_at=started,
                finished_at=None if status == "in_progress" else started,
            )
        )
    return ident


async def _state(services: Services, delivery_id: uuid.UUID) -> tuple[str, dt.datetime | None]:
    row = await delivery_row(
        services.sessions, delivery_id, deliveries.c.status, deliveries.c.next_attempt_at
    )
    return row.status, row.next_attempt_at


async def _attempt_status(services: Services, attempt_id: uuid.UUID) -> str:
    async with services.sessions() as s:
        status: str = await s.scalar(select(attempts.c.status).where(attempts.c.id == attempt_id))
    return status


async def test_stale_in_progress_attempts_become_unknown(services: Services) -> None:
    now = utcnow()
    old = now - dt.timedelta(seconds=600)
    async with services.sessions() as s, s.begin():
        stale, fresh, delivered = await insert_deliveries(s, 3, status="sending", next_at=None)
        await s.execute(
            deliveries.update()
            .where(deliveries.c.id.in_([stale, fresh, delivered]))
            .values(next_attempt_at=None)
        )
        await s.execute(
            deliveries.update().where(deliveries.c.id == delivered).values(status="delivered")
        )
    a_stale = await _attempt(services, stale, old, "in_progress")
    a_fresh = await _attempt(services, fresh, now - dt.timedelta(seconds=5), "in_progress")
    a_delivered = await _attempt(services, delivered, old, "in_progress")

    count = await sweep_stale(
        services.engine,
        services.delivery_queue,
        older_than_seconds=120,
        now=now,
        settle_seconds=300,
    )
    assert count == 2
    assert await _attempt_status(services, a_stale) == "unknown"
    assert await _attempt_status(services, a_fresh) == "in_progress"
    assert await _attempt_status(services, a_delivered) == "unknown"
    assert await _state(services, stale) == ("unknown", now + dt.timedelta(seconds=300))
    # a provider callback already told the truth: the delivery is left alone
    assert await _state(services, delivered) == ("delivered", None)
    assert (await _state(services, fresh))[0] == "sending"
    # running it again changes nothing
    assert (
        await sweep_stale(services.engine, services.delivery_queue, older_than_seconds=120, now=now)
        == 0
    )


async def test_abandoned_claims_are_requeued(services: Services) -> None:
    now = utcnow()
    claimed_at = now - dt.timedelta(seconds=600)
    async with services.sessions() as s, s.begin():
        untouched, recent = await insert_deliveries(s, 2, status="retrying")
        (unrecorded,) = await insert_deliveries(s, 1, status="sending")
        # claimed by a worker that died before dispatching: off the queue, status unchanged
        await s.execute(
            deliveries.update()
            .where(deliveries.c.id.in_([untouched, unrecorded]))
            .values(next_attempt_at=None, updated_at=claimed_at)
        )
        await s.execute(
            deliveries.update().where(deliveries.c.id == recent).values(next_attempt_at=None)
        )
    # an attempt ran and finished, but its outcome never reached the delivery
    await _attempt(services, unrecorded, claimed_at + dt.timedelta(seconds=1), "accepted")

    count = await sweep_stale(
        services.engine, services.delivery_queue, older_than_seconds=120, now=now, settle_seconds=60
    )
    assert count == 2
    assert await _state(services, untouched) == ("retrying", now)
    assert await _state(services, unrecorded) == ("unknown", now + dt.timedelta(seconds=60))
    # claimed a moment ago: its worker is still on it
    assert await _state(services, recent) == ("retrying", None)
