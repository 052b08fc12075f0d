"""Background work of a gateway process: the retry worker, the stale-attempt sweeper, the
campaigns' expansion job, and the outbound webhook push worker (a task of its own, so a slow
endpoint never holds retries).

The `retry` package owns the worker loop (`retry.worker.Worker`); this module only hands it
its adapters: the engine, the delivery log's queue operations, the settings and the send
path's dispatch function (all typed fields of `gateway.services.Services`), so `retry` never
imports `sender`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator

from gateway.services import Services, replay_sandbox_feedback
from gateway.settings import Settings
from retry.worker import Worker
from sender import events
from suppression.db import pg_connection, utcnow

log = logging.getLogger("gateway")


def background_tasks(
    settings: Settings, *, in_server: bool
) -> Iterator[Callable[[Services], Awaitable[None]]]:
    """Tasks a `serve` process runs beside the HTTP server: the sandbox's replay of pending
    simulated callbacks, the retry worker and the webhook push worker (both with
    GATEWAY_WORKER_ENABLED)."""
    if in_server:
        yield replay_sandbox_feedback
    if settings.retry.worker_enabled:
        yield run_worker
        yield run_webhook_pusher


def build_worker(services: Services) -> Worker:
    """The retry worker for these services."""
    # Parked callbacks whose send has since recorded its provider id are applied here too,
    # in case the send path's own hook missed them (e.g. the process died in between).
    return Worker(
        services.engine,
        services.delivery_queue,
        services.dispatch,
        services.settings.retry,
        # The reputation guard evaluates the window every GATEWAY_REPUTATION_EVALUATE_SECONDS
        # (one process at a time: an advisory lock).
        maintenance=[
            services.ingestor.sweep_parked,
            event_pruner(services),
            services.reputation.maybe_evaluate,
        ],
        wakeup=services.wakeup,
    )


# Batches of event rows deleted per sweep at most (each batch is its own short statement).
PRUNE_BATCHES = 10


def event_pruner(
    services: Services, clock: Callable[[], dt.datetime] = utcnow
) -> Callable[[], Awaitable[int]]:
    """The sweep's retention job: delete events older than GATEWAY_EVENT_RETENTION_DAYS."""

    async def prune() -> int:
        before = clock() - dt.timedelta(days=services.settings.event_retention_days)
        total = 0
        async with pg_connection(services.engine) as conn:
            for _ in range(PRUNE_BATCHES):
                deleted = await events.prune(conn, before=before)
                total += deleted
                if deleted < events.PRUNE_BATCH:
                    break
        return total

    return prune


async def run_worker(services: Services) -> None:
    """Run the retry worker (and its sweeper) and the campaigns' expansion job until
    cancelled; cancelling stops them gracefully: claimed deliveries not yet dispatched go
    back on the queue, calls under way may finish, an expansion batch under way is rolled
    back (and redone by the next run)."""
    expansion = asyncio.create_task(run_campaigns(services))
    try:
        await build_worker(services).run()
    finally:
        expansion.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expansion


async def run_campaigns(services: Services) -> None:
    """The campaigns' expansion job (`sender.campaigns.CampaignService.run`)."""
    await services.campaigns.run(poll_seconds=services.settings.campaign_poll_seconds)


async def run_webhook_pusher(services: Services) -> None:
    """Run the outbound webhook worker (fan-out from the event feed, signed pushes) until
    cancelled; a lease left by a push under way is taken over by any worker after it runs out."""
    await services.outbound.worker().run()


async def _run_all(services: Services) -> None:
    tasks = [
        asyncio.ensure_future(run_worker(services)),
        asyncio.ensure_future(run_webhook_pusher(services)),
    ]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        # gather has cancelled both: let them stop gracefully (a second cancel would cut
        # their shutdown grace short).
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    except Exception:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def run_worker_until_signalled(services: Services) -> None:
    """`gateway worker`: run the retry worker and the webhook push worker until SIGTERM or
    SIGINT, then stop gracefully and close."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(_run_all(services))
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await services.close()
        log.info("retry worker process stopped")
