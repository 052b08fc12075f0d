"""Worker + policy + DLQ against a dispatch that follows the documented contract.

`ContractDispatch` (tests/retry/helpers.py) makes one attempt per call against a local stub
provider and reschedules by `retry.policy`; with the jitter pinned to the top of its range the
retry timing is deterministic, so the growing gaps can be checked exactly (lower bounds: the
worker never retries early). The same flows run through the real send path in
test_end_to_end.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid

from sqlalchemy import select

from gateway.services import Services
from retry import dlq
from retry.breaker import InProcessBreaker
from retry.policy import Backoff, ceiling_seconds
from retry.settings import RetrySettings
from retry.worker import Worker
from tests.retry.helpers import (
    ContractDispatch,
    MaxRng,
    StubProvider,
    attempt_rows,
    delivery_status,
    insert_deliveries,
    run_worker_until,
)
from tests.support.tables import deliveries


async def _run_until_settled(worker: Worker, services: Services, ids: list[uuid.UUID]) -> None:
    async def settled() -> bool:
        async with services.sessions() as s:
            pending = await s.scalar(
                select(deliveries.c.id)
                .where(
                    deliveries.c.id.in_(ids),
                    deliveries.c.status.in_(["queued", "retrying", "sending", "unknown"]),
                )
                .limit(1)
            )
        return pending is None

    try:
        await run_worker_until(worker, settled)
    except AssertionError as exc:
        # Say where each delivery stands (this failed once on a loaded machine, not since).
        async with services.sessions() as s:
            rows = (
                await s.execute(
                    select(
                        deliveries.c.id,
                        deliveries.c.status,
                        deliveries.c.attempts,
                        deliveries.c.next_attempt_at,
                        deliveries.c.reason,
                    ).where(deliveries.c.id.in_(ids))
                )
            ).all()
            tries = await attempt_rows(services.sessions, ids[0])
        raise AssertionError(f"{exc}: deliveries {rows}, attempts of the first {tries}") from exc


async def test_500_n_times_then_200_with_growing_gaps(
    services: Services, retry_settings: RetrySettings, stub: StubProvider
) -> None:
    n = 4
    settings = dataclasses.replace(
        retry_settings, base_seconds=0.04, max_seconds=10.0, max_attempts=6
    )
    async with services.sessions() as s, s.begin():
        (delivery_id,) = await insert_deliveries(s, 1, status="queued")
    stub.fail(delivery_id, [500] * n)
    dispatch = ContractDispatch(services.sessions, settings, stub.url, rng=MaxRng())
    try:
        await _run_until_settled(
            Worker(services.engine, services.delivery_queue, dispatch, settings),
            services,
            [delivery_id],
        )
    finally:
        await dispatch.aclose()
    assert await delivery_status(services.sessions, delivery_id) == "sent"
    assert len(stub.calls_for(delivery_id)) == n + 1
    backoff = Backoff(0.04, 10.0, 6)
    expected = [ceiling_seconds(backoff, k) for k in range(1, n + 1)]  # 0.04, 0.08, 0.16, 0.32
    assert dispatch.scheduled_delays == expected
    times = [c.at for c in stub.calls_for(delivery_id)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # every retry waited at least its (growing) delay: never early
    assert all(gap >= delay for gap, delay in zip(gaps, expected, strict=True))
    assert expected == sorted(expected) and len(set(expected)) == n


async def test_always_failing_then_dlq_then_redrive(
    services: Services, retry_settings: RetrySettings, stub: StubProvider
) -> None:
    settings = dataclasses.replace(retry_settings, max_attempts=3)
    async with services.sessions() as s, s.begin():
        (delivery_id,) = await insert_deliveries(s, 1, status="queued", channel="email")
    stub.fail(delivery_id, [503] * 3)
    dispatch = ContractDispatch(services.sessions, settings, stub.url)
    worker = Worker(services.engine, services.delivery_queue, dispatch, settings)
    try:
        await _run_until_settled(worker, services, [delivery_id])
        assert await delivery_status(services.sessions, delivery_id) == "dead"
        assert len(stub.calls_for(delivery_id)) == 3
        async with services.sessions() as s:
            entries, _ = await dlq.list_entries(s, services.delivery_queue, dlq.DeadLetterFilter())
        (entry,) = entries
        assert entry.row.reason == "max_attempts" and entry.row.last_error == "HTTP 503"
        assert [h["error_code"] for h in entry.row.attempt_history] == ["503"] * 3

        async with services.sessions() as s:
            await dlq.redrive(s, services.delivery_queue, entry.row.id, actor="test")
            await s.commit()
        # a fresh budget: attempts counter back to 0, history kept
        async with services.sessions() as s:
            row = (
                await s.execute(
                    select(deliveries.c.status, deliveries.c.attempts).where(
                        deliveries.c.id == delivery_id
                    )
                )
            ).one()
        assert (row.status, row.attempts) == ("queued", 0)
        await _run_until_settled(worker, services, [delivery_id])
    finally:
        await dispatch.aclose()
    assert await delivery_status(services.sessions, delivery_id) == "sent"
    assert len(stub.calls_for(delivery_id)) == 4
    assert await attempt_rows(services.sessions, delivery_id) == [
        (1, "transient"),
        (2, "transient"),
        (3, "transient"),
        (4, "accepted"),
    ]


async def test_retry_after_is_honoured(services: Services, retry_settings: RetrySettings) -> None:
    settings = dataclasses.replace(retry_settings, base_seconds=0.001, max_seconds=0.002)
    with StubProvider(retry_after=0.3) as provider:
        async with services.sessions() as s, s.begin():
            (delivery_id,) = await insert_deliveries(s, 1, status="queued")
        provider.fail(delivery_id, [429])
        dispatch = ContractDispatch(services.sessions, settings, provider.url)
        try:
            await _run_until_settled(
                Worker(services.engine, services.delivery_queue, dispatch, settings),
                services,
                [delivery_id],
            )
        finally:
            await dispatch.aclose()
    assert dispatch.scheduled_delays == [0.3]
    first, second = [c.at for c in provider.calls_for(delivery_id)]
    assert second - first >= 0.3


async def test_an_open_circuit_defers_without_counting_attempts(
    services: Services, retry_settings: RetrySettings, stub: StubProvider
) -> None:
    clock = [1000.0]
    breaker = InProcessBreaker(clock=lambda: clock[0])
    await breaker.record_failure("stub", account_level=True)
    async with services.sessions() as s, s.begin():
        ids = await insert_deliveries(s, 5, status="queued")
    dispatch = ContractDispatch(services.sessions, retry_settings, stub.url, breaker=breaker)
    worker = Worker(services.engine, services.delivery_queue, dispatch, retry_settings)
    try:
        await worker.run_once()
        async with services.sessions() as s:
            rows = (
                await s.execute(
                    select(deliveries.c.status, deliveries.c.attempts).where(
                        deliveries.c.id.in_(ids)
                    )
                )
            ).all()
        assert {(r.status, r.attempts) for r in rows} == {("retrying", 0)}
        assert stub.count == 0
        clock[0] += 10_000  # cool-down over: one probe, then closed again
        await _run_until_settled(worker, services, ids)
    finally:
        await dispatch.aclose()
    assert stub.count == 5
    assert await breaker.state("stub") == "closed"
