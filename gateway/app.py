"""The app factory: routes of every package, auth, problem documents, body limits, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.auth import api_key_guard
from gateway.health import healthz, readyz
from gateway.inputs import check_request
from gateway.keys_api import KeysController
from gateway.metrics import metrics
from gateway.problems import EXCEPTION_HANDLERS
from gateway.services import Services
from gateway.settings import Settings
from gateway.subjects import ROUTES as SUBJECT_ROUTES
from retry.api import DeadLetterController
from retry.queue import DeliveryQueue
from sender.api import MessagesController
from suppression.api import ROUTES as SUPPRESSION_ROUTES
from webhooks.api import ROUTES as WEBHOOK_ROUTES

log = logging.getLogger("gateway")

VERSION = "0.1.0"


async def provide_db_session(state: State) -> AsyncIterator[AsyncSession]:
    """A session per request; handlers commit explicitly and keep transactions short."""
    services: Services = state.services
    async with services.sessions() as session:
        yield session


def provide_services(state: State) -> Services:
    """The process-wide service graph."""
    services: Services = state.services
    return services


def provide_delivery_queue(state: State) -> DeliveryQueue:
    """The delivery log's operations for the dead-letter routes (`sender.log`)."""
    services: Services = state.services
    return services.delivery_queue


def route_handlers() -> list[Any]:
    """Every package's routes; the composition root is the only place that lists them."""
    handlers: list[Any] = [healthz, readyz, metrics, KeysController]
    handlers += [*SUPPRESSION_ROUTES, *SUBJECT_ROUTES]
    handlers.append(MessagesController)
    handlers += WEBHOOK_ROUTES
    handlers.append(DeadLetterController)
    return handlers


def create_app(
    services: Services | None = None,
    *,
    settings: Settings | None = None,
    background: Sequence[Callable[[Services], Any]] = (),
    owns_services: bool = False,
) -> Litestar:
    """Build the ASGI app. Without `services` the app can only describe itself (OpenAPI).

    `background` tasks run for the app's lifetime; with `owns_services` the services are closed
    when the app shuts down (after those tasks), as `gateway serve` wants for each worker."""
    settings = settings or (services.settings if services else Settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(start(services)) for start in background] if services else []
        # Everything alive now (modules, routes, the service graph) lives as long as the
        # process: keep it out of the cyclic collector's full passes, whose cost grows with
        # every object they must walk and which otherwise pause the event loop for tens of
        # milliseconds under load.
        gc.freeze()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if owns_services and services is not None:
                await services.close()

    return Litestar(
        route_handlers=route_handlers(),
        guards=[api_key_guard],
        before_request=check_request,
        dependencies={
            "db_session": Provide(provide_db_session),
            "services": Provide(provide_services, sync_to_thread=False),
            "delivery_queue": Provide(provide_delivery_queue, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_body_bytes,
        state=State({"services": services}),
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="Provider feedback and suppression gateway",
            version=VERSION,
            components=Components(
                security_schemes={
                    "apiKey": SecurityScheme(type="http", scheme="bearer", description="API key")
                }
            ),
        ),
        debug=False,
        # Logging is configured once per process (`gateway.runtime.configure_logging`):
        # Litestar's own default would add a second root handler in another format.
        logging_config=None,
    )


def openapi_yaml(app: Litestar | None = None) -> str:
    """The OpenAPI document of the app, as YAML (what `openapi.yaml` must contain)."""
    import yaml

    app = app or create_app()
    schema = app.openapi_schema.to_schema()
    return yaml.safe_dump(schema, sort_keys=False, allow_unicode=True)
