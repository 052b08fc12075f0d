"""Background work of a gateway process: the retry worker and the stale-attempt sweeper.

The `retry` package owns the worker loop (`retry.worker.Worker`); this module only hands it
its adapters: the sessions, the settings and the send path's dispatch function (wired by
`gateway.services` as `services.extra["dispatch"]`), so `retry` never imports `sender`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator

from gateway.services import Services
from gateway.settings import Settings
from retry.worker import Dispatch, Worker

log = logging.getLogger("gateway")


def background_tasks(
    settings: Settings, *, in_server: bool
) -> Iterator[Callable[[Services], Awaitable[None]]]:
    """Tasks a `serve` process runs beside the HTTP server (GATEWAY_WORKER_ENABLED)."""
    if settings.retry.worker_enabled:
        yield run_worker


def build_worker(services: Services) -> Worker | None:
    """The retry worker for these services, or None when no dispatch is wired."""
    dispatch: Dispatch | None = services.extra.get("dispatch")
    if dispatch is None:
        return None
    ingestor = services.extra.get("ingestor")
    # Parked callbacks whose send has since recorded its provider id are applied here too,
    # in case the send path's own hook missed them (e.g. the process died in between).
    maintenance = [ingestor.sweep_parked] if ingestor is not None else []
    return Worker(services.sessions, dispatch, services.settings.retry, maintenance=maintenance)


async def run_worker(services: Services) -> None:
    """Run the retry worker (and its sweeper) until cancelled; cancelling stops it gracefully:
    claimed deliveries not yet dispatched go back on the queue, calls under way may finish."""
    worker = build_worker(services)
    if worker is None:
        log.error("retry worker not started: no dispatch function is wired")
        await asyncio.Event().wait()  # stay alive (and cancellable) like a running worker
        return
    await worker.run()


async def run_worker_until_signalled(services: Services) -> None:
    """`gateway worker`: run until SIGTERM or SIGINT, then stop gracefully and close."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(run_worker(services))
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await services.close()
        log.info("retry worker process stopped")
