"""The worker: claim order, settling before dispatch, unknown-outcome policy, shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import uuid

from sqlalchemy import select

from gateway.services import Services
from retry.models import DeadLetter
from retry.settings import RetrySettings
from retry.worker import Worker
from suppression.db import utcnow
from tests.retry.helpers import insert_deliveries, run_worker_until
from tests.support.tables import attempts, deliveries


class Recorder:
    """A dispatch that records the order of calls and marks the delivery sent."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.calls: list[uuid.UUID] = []

    async def __call__(self, delivery_id: uuid.UUID) -> str:
        self.calls.append(delivery_id)
        async with self.services.sessions() as s, s.begin():
            await s.execute(
                deliveries.update().where(deliveries.c.id == delivery_id).values(status="sent")
            )
        return "sent"


async def test_high_priority_is_claimed_before_older_low(
    services: Services, retry_settings: RetrySettings
) -> None:
    now = utcnow()
    async with services.sessions() as s, s.begin():
        low = await insert_deliveries(s, 15, priority="low", next_at=now - dt.timedelta(minutes=5))
        normal = await insert_deliveries(
            s, 10, priority="normal", next_at=now - dt.timedelta(minutes=3)
        )
        high = await insert_deliveries(
            s, 10, priority="high", next_at=now - dt.timedelta(seconds=1)
        )
        later = await insert_deliveries(s, 5, priority="high", next_at=now + dt.timedelta(hours=1))
    recorder = Recorder(services)
    worker = Worker(
        services.engine,
        services.delivery_queue,
        recorder,
        dataclasses.replace(retry_settings, worker_batch=4, worker_concurrency=1),
    )
    result = await worker.drain()
    assert result.claimed == 35 and result.dead_lettered == 0
    assert recorder.calls[:10] and set(recorder.calls[:10]) == set(high)
    assert set(recorder.calls[10:20]) == set(normal)
    assert set(recorder.calls[20:]) == set(low)
    # not yet due: untouched
    async with services.sessions() as s:
        statuses = (
            (await s.execute(select(deliveries.c.status).where(deliveries.c.id.in_(later))))
            .scalars()
            .all()
        )
    assert statuses == ["retrying"] * 5


async def _dead_letters(services: Services) -> dict[uuid.UUID, DeadLetter]:
    async with services.sessions() as s:
        rows = (await s.execute(select(DeadLetter))).scalars().all()
    return {r.delivery_id: r for r in rows}


async def _status(services: Services, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[str, object]]:
    async with services.sessions() as s:
        rows = await s.execute(
            select(deliveries.c.id, deliveries.c.status, deliveries.c.next_attempt_at).where(
                deliveries.c.id.in_(ids)
            )
        )
        return {r.id: (r.status, r.next_attempt_at) for r in rows}


async def test_expired_and_exhausted_are_dead_lettered_not_dispatched(
    services: Services, retry_settings: RetrySettings
) -> None:
    now = utcnow()
    async with services.sessions() as s, s.begin():
        expired = await insert_deliveries(s, 2, expires_at=now - dt.timedelta(seconds=1))
        exhausted = await insert_deliveries(s, 2, attempts_made=retry_settings.max_attempts)
        fine = await insert_deliveries(
            s,
            2,
            attempts_made=retry_settings.max_attempts - 1,
            expires_at=now + dt.timedelta(hours=1),
        )
        await s.execute(
            deliveries.update().where(deliveries.c.id.in_(exhausted)).values(last_error="HTTP 500")
        )
        # history of one exhausted delivery
        await s.execute(
            attempts.insert().values(
                id=uuid.uuid4(),
                delivery_id=exhausted[0],
                number=1,
                status="transient",
                provider="stub",
                error_code="500",
                error_message="HTTP 500",
                started_at=now - dt.timedelta(seconds=30),
                finished_at=now - dt.timedelta(seconds=29),
            )
        )
    recorder = Recorder(services)
    result = await Worker(
        services.engine, services.delivery_queue, recorder, retry_settings
    ).drain()
    assert result.claimed == 6 and result.dead_lettered == 4
    assert sorted(recorder.calls) == sorted(fine)
    dead = await _dead_letters(services)
    assert {i: dead[i].reason for i in expired + exhausted} == {
        **{i: "expired" for i in expired},
        **{i: "max_attempts" for i in exhausted},
    }
    entry = dead[exhausted[0]]
    assert entry.channel == "sms" and entry.last_error == "HTTP 500"
    assert [(h["number"], h["status"], h["error_code"]) for h in entry.attempt_history] == [
        (1, "transient", "500")
    ]
    statuses = await _status(services, expired + exhausted)
    assert all(v == ("dead", None) for v in statuses.values())


async def test_unknown_outcome_policy(services: Services, retry_settings: RetrySettings) -> None:
    # After the settle window (no correlating callback moved it): transactional retries,
    # marketing is dead-lettered by default, or retried when so configured.
    async with services.sessions() as s, s.begin():
        otp = await insert_deliveries(s, 1, status="unknown", attempts_made=1)
        promo = await insert_deliveries(
            s, 1, status="unknown", category="marketing", topic="news", attempts_made=1
        )
    recorder = Recorder(services)
    await Worker(services.engine, services.delivery_queue, recorder, retry_settings).drain()
    assert recorder.calls == otp
    dead = await _dead_letters(services)
    assert list(dead) == promo and dead[promo[0]].reason == "unknown_outcome"

    async with services.sessions() as s, s.begin():
        promo2 = await insert_deliveries(
            s, 1, status="unknown", category="marketing", topic="news", attempts_made=1
        )
    recorder = Recorder(services)
    settings = dataclasses.replace(retry_settings, unknown_outcome_marketing="retry")
    await Worker(services.engine, services.delivery_queue, recorder, settings).drain()
    assert recorder.calls == promo2


async def test_policy_overrides_per_channel_and_priority(
    services: Services, retry_settings: RetrySettings
) -> None:
    from retry.settings import parse_policies

    settings = dataclasses.replace(
        retry_settings, max_attempts=5, policies=parse_policies("sms.high=//2,email=//3")
    )
    async with services.sessions() as s, s.begin():
        sms_high = await insert_deliveries(s, 1, priority="high", attempts_made=2)
        sms_low = await insert_deliveries(s, 1, priority="low", attempts_made=2)
        email = await insert_deliveries(s, 1, channel="email", attempts_made=3)
        email_ok = await insert_deliveries(s, 1, channel="email", attempts_made=2)
    recorder = Recorder(services)
    await Worker(services.engine, services.delivery_queue, recorder, settings).drain()
    assert sorted(recorder.calls) == sorted(sms_low + email_ok)
    assert set(await _dead_letters(services)) == set(sms_high + email)


async def test_a_failing_dispatch_puts_the_delivery_back(
    services: Services, retry_settings: RetrySettings
) -> None:
    async with services.sessions() as s, s.begin():
        ids = await insert_deliveries(s, 3, status="retrying", attempts_made=1)

    async def broken(delivery_id: uuid.UUID) -> str:
        raise RuntimeError("send path bug")

    result = await Worker(
        services.engine, services.delivery_queue, broken, retry_settings
    ).run_once()
    assert result.claimed == 3
    statuses = await _status(services, ids)
    # back on the queue, same status, due after the deferral; no attempt was counted
    assert {v[0] for v in statuses.values()} == {"retrying"}
    assert all(v[1] is not None for v in statuses.values())
    async with services.sessions() as s:
        counts = (
            (await s.execute(select(deliveries.c.attempts).where(deliveries.c.id.in_(ids))))
            .scalars()
            .all()
        )
    assert counts == [1, 1, 1]


async def test_cancel_releases_claimed_rows_and_lets_calls_finish(
    services: Services, retry_settings: RetrySettings
) -> None:
    async with services.sessions() as s, s.begin():
        ids = await insert_deliveries(s, 6, status="queued")
    started: list[uuid.UUID] = []
    release = asyncio.Event()
    finished: list[uuid.UUID] = []
    recorder = Recorder(services)

    async def slow(delivery_id: uuid.UUID) -> str:
        started.append(delivery_id)
        await release.wait()
        status = await recorder(delivery_id)
        finished.append(delivery_id)
        return status

    settings = dataclasses.replace(retry_settings, worker_batch=6, worker_concurrency=2)
    task = asyncio.create_task(
        Worker(services.engine, services.delivery_queue, slow, settings).run()
    )
    # `normal` deliveries are served by the normal and the low lanes: 2 slots each, all busy
    # (a lane claims no more rows than it has free slots, so the others stay on the queue).
    for _ in range(1000):
        if len(started) == 4:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0)
    release.set()  # the calls under way finish during the grace period
    try:
        await task
    except asyncio.CancelledError:
        pass
    statuses = await _status(services, ids)
    assert len(finished) == 4
    assert all(statuses[i][0] == "sent" for i in finished)
    others = [i for i in ids if i not in finished]
    # released exactly as they were: queued and due
    assert all(statuses[i][0] == "queued" and statuses[i][1] is not None for i in others)


async def test_two_workers_in_one_process_send_each_once(
    services: Services, retry_settings: RetrySettings
) -> None:
    async with services.sessions() as s, s.begin():
        ids = await insert_deliveries(s, 300)
    recorder = Recorder(services)
    settings = dataclasses.replace(retry_settings, worker_batch=7, worker_concurrency=3)
    await asyncio.gather(
        Worker(services.engine, services.delivery_queue, recorder, settings).drain(),
        Worker(services.engine, services.delivery_queue, recorder, settings).drain(),
    )
    assert sorted(recorder.calls) == sorted(ids)


async def test_running_worker_picks_up_new_work(
    services: Services, retry_settings: RetrySettings
) -> None:
    recorder = Recorder(services)
    ids: list[uuid.UUID] = []

    async def picked_up() -> bool:
        if not ids:  # the worker is running already when the work is added
            async with services.sessions() as s, s.begin():
                ids.extend(
                    await insert_deliveries(s, 5, next_at=utcnow() + dt.timedelta(seconds=0.2))
                )
        return len(recorder.calls) == 5

    await run_worker_until(
        Worker(services.engine, services.delivery_queue, recorder, retry_settings), picked_up
    )
    assert sorted(recorder.calls) == sorted(ids)


async def test_gateway_wiring(services: Services, retry_settings: RetrySettings) -> None:
    from gateway.services import replay_sandbox_feedback
    from gateway.settings import Settings
    from gateway.worker import background_tasks, build_worker, run_webhook_pusher, run_worker
    from tests.conftest import replace_settings

    on: Settings = replace_settings(
        services.settings, retry=dataclasses.replace(retry_settings, worker_enabled=True)
    )
    assert list(background_tasks(on, in_server=True)) == [
        replay_sandbox_feedback,
        run_worker,
        run_webhook_pusher,
    ]
    off = replace_settings(on, retry=dataclasses.replace(retry_settings, worker_enabled=False))
    # the sandbox's pending callbacks are replayed whether the retry worker runs or not
    assert list(background_tasks(off, in_server=True)) == [replay_sandbox_feedback]
    # the composition root hands the worker the send path's dispatch
    assert build_worker(services) is not None
    assert services.dispatch is not None
