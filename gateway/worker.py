"""Background work of a gateway process: the retry worker and the stale-attempt sweeper.

The `retry` package owns the worker loop; this module only hands it its adapters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator

from gateway.services import Services
from gateway.settings import Settings

log = logging.getLogger("gateway")


def background_tasks(
    settings: Settings, *, in_server: bool
) -> Iterator[Callable[[Services], Awaitable[None]]]:
    """Tasks a `serve` process runs beside the HTTP server."""
    if settings.retry.worker_enabled:
        yield run_worker


async def run_worker(services: Services) -> None:
    """Run the retry worker until cancelled."""
    log.info("retry worker started")
    while True:
        await asyncio.sleep(services.settings.retry.worker_poll_seconds)
