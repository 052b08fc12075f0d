"""The app factory: routes of every package, auth, problem documents, body limits, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from litestar import Litestar, Request
from litestar.datastructures import MutableScopeHeaders, State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIFormat,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.routes import HTTPRoute
from litestar.types import Message, Scope
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.auth import api_key_guard
from gateway.console.routes import console_router
from gateway.health import healthz, readyz
from gateway.inputs import check_request
from gateway.keys_api import KeysController
from gateway.logs import RequestContext, ensure_request_id
from gateway.metrics import metrics, observe_request
from gateway.problems import EXCEPTION_HANDLERS, PROBLEM_JSON
from gateway.providers import PROVIDERS, Registration
from gateway.reports import stale_report_route
from gateway.services import Services
from gateway.settings import Settings
from gateway.subjects import ROUTES as SUBJECT_ROUTES
from retry.api import DeadLetterController
from retry.queue import DeliveryQueue
from sender.api import MessagesController
from sender.campaigns_api import CampaignsController
from sender.events_api import EventsController
from sender.mailbox_api import SandboxMailboxController
from sender.reputation_api import ReputationController
from suppression.api import ROUTES as SUPPRESSION_ROUTES
from webhooks.outbound.api import ROUTES as OUTBOUND_ROUTES

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


async def authenticate_and_check(request: Request[Any, Any, Any]) -> None:
    """The app-wide `before_request` hook: the API key and the scope the route requires
    (`gateway.auth.api_key_guard`), then the input gate (`gateway.inputs.check_request`).

    Authentication runs here rather than as a Litestar guard because Litestar copies the
    route handler object for every guard call, which cost a send about 3 % of its CPU. Both
    run before the body is read or decoded, as guards do."""
    await api_key_guard(request, request.route_handler)
    await check_request(request)


def route_handlers(providers: Sequence[Registration] = PROVIDERS) -> list[Any]:
    """Every package's routes; the composition root is the only place that lists them (the
    webhook routes are those of the registered providers, gateway/providers.py)."""
    handlers: list[Any] = [healthz, readyz, metrics, KeysController]
    handlers += [*SUPPRESSION_ROUTES, *SUBJECT_ROUTES]
    handlers += [MessagesController, CampaignsController, SandboxMailboxController]
    handlers.append(EventsController)
    handlers += [
        route for r in providers if r.feedback is not None for route in r.feedback.routes()
    ]
    handlers += OUTBOUND_ROUTES
    handlers.append(DeadLetterController)
    handlers += [ReputationController, stale_report_route]
    # The operator console (HTML, outside the OpenAPI document).
    handlers.append(console_router())
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
        openapi_document(app)
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
        route_handlers=route_handlers(services.providers if services else PROVIDERS),
        before_request=authenticate_and_check,
        dependencies={
            "db_session": Provide(provide_db_session),
            "services": Provide(provide_services, sync_to_thread=False),
            "delivery_queue": Provide(provide_delivery_queue, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        before_send=[complete_allow_header, ensure_request_id],
        # Request id (X-Request-Id, log context), access line and request-duration metric.
        middleware=[lambda app: RequestContext(app, observe_request)],
        request_max_body_size=settings.max_body_bytes,
        state=State({"services": services}),
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="Provider feedback and suppression gateway",
            version=VERSION,
            components=Components(
                security_schemes={
                    "apiKey": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description=(
                            "API key. An operation lists the scope it needs; `admin` implies "
                            "every scope."
                        ),
                    )
                },
            ),
        ),
        debug=False,
        # Logging is configured once per process (`gateway.runtime.configure_logging`):
        # Litestar's own default would add a second root handler in another format.
        logging_config=None,
    )


# --- the published contract ----------------------------------------------------------------------

PROBLEM_SCHEMA = Schema(
    type=OpenAPIType.OBJECT,
    description=(
        "An RFC 9457 problem document (application/problem+json), the body of every error "
        "response. `type` names the problem (`urn:problem:...`, or `about:blank` for a bare "
        "HTTP status); some types add members, e.g. `errors` for request validation."
    ),
    required=["type", "title", "status"],
    properties={
        "type": Schema(type=OpenAPIType.STRING),
        "title": Schema(type=OpenAPIType.STRING),
        "status": Schema(type=OpenAPIType.INTEGER, minimum=400, maximum=599),
        "detail": Schema(type=OpenAPIType.STRING),
        "errors": Schema(type=OpenAPIType.ARRAY, items=Schema(type=OpenAPIType.OBJECT)),
    },
)
_PROBLEM = Reference(ref="#/components/schemas/Problem")


def _is_litestar_error_schema(response: OpenAPIResponse) -> bool:
    """Litestar documents errors as `application/json {status_code, detail, extra}`; this app
    renders every error as a problem document instead (gateway.problems)."""
    media = (response.content or {}).get("application/json")
    schema = media.schema if media else None
    return isinstance(schema, Schema) and "status_code" in (schema.properties or {})


def openapi_document(app: Litestar) -> OpenAPI:
    """The app's OpenAPI document, completed with what only the composition root knows:
    every error is a problem document (`components.schemas.Problem`); a route guarded by an
    API-key scope (`opt={"scope": ...}`, gateway.auth) requires the bearer key and answers
    401/403; a body over the size limit is 413. Litestar cannot express these per layer. It
    also marks every request body required (optional ones too) and does not say that a
    date-time may be given as a number. Idempotent; runs at startup, before /schema can be
    served, and for `gateway openapi`."""
    openapi = app.openapi_schema
    schemas = openapi.components.schemas if openapi.components.schemas is not None else {}
    if "Problem" in schemas:
        return openapi
    schemas["Problem"] = PROBLEM_SCHEMA
    openapi.components.schemas = dict(sorted(schemas.items()))
    _also_unix_times(openapi)
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or route.path_format not in (openapi.paths or {}):
            continue
        item = (openapi.paths or {})[route.path_format]
        for method, (handler, _) in route.route_handler_map.items():
            operation = getattr(item, method.lower(), None)
            if operation is None or operation.responses is None:
                continue
            responses = operation.responses
            # Litestar marks every request body required; `data: X | None = None` is not.
            data = handler.parsed_fn_signature.parameters.get("data")
            if data is not None and data.has_default and operation.request_body is not None:
                assert isinstance(operation.request_body, RequestBody)
                operation.request_body.required = False
            _input_gate_rules(operation, schemas)
            limit = handler.resolve_request_max_body_size()
            if operation.request_body is not None and limit:
                responses.setdefault(
                    "413", OpenAPIResponse(description=f"The body is over {limit} bytes")
                )
            if scope := handler.opt.get("scope"):
                operation.security = [{"apiKey": [scope]}]
                responses.setdefault(
                    "401",
                    OpenAPIResponse(
                        description="No API key, or an unknown or revoked one",
                        headers={
                            "WWW-Authenticate": OpenAPIHeader(
                                schema=Schema(type=OpenAPIType.STRING)
                            )
                        },
                    ),
                )
                responses.setdefault(
                    "403", OpenAPIResponse(description=f"The API key lacks the '{scope}' scope")
                )
            for status, response in responses.items():
                if not isinstance(response, OpenAPIResponse) or int(status) < 400:
                    continue
                if response.content is None or _is_litestar_error_schema(response):
                    response.content = {PROBLEM_JSON: OpenAPIMediaType(schema=_PROBLEM)}
            operation.responses = dict(sorted(responses.items()))
    return openapi


# What the input gate (gateway.inputs) refuses in a path or query parameter: C0 controls.
_NO_CONTROLS = "^[^\\x00-\\x1f]*$"


def _input_gate_rules(operation: Any, schemas: dict[str, Any]) -> None:
    """Say what `gateway.inputs` enforces on every route: text path and query parameters
    hold no C0 control character (400), a JSON body's text neither (422), and a JSON body
    has no members beyond its schema's (msgspec `forbid_unknown_fields`: 400)."""
    for parameter in operation.parameters or []:
        schema = getattr(parameter, "schema", None)
        if (
            getattr(parameter, "param_in", None) in ("path", "query")
            and isinstance(schema, Schema)
            and schema.type == OpenAPIType.STRING
            and not schema.pattern
            and not schema.enum
            and schema.format is None
        ):
            parameter.schema = dataclasses.replace(schema, pattern=_NO_CONTROLS)
    body = operation.request_body
    media = (body.content or {}).get("application/json") if isinstance(body, RequestBody) else None
    if media is None or operation.responses is None:
        return
    operation.responses.setdefault(
        "422",
        OpenAPIResponse(
            description="Text holds a control character (urn:problem:invalid-text), or the "
            "content is not acceptable"
        ),
    )
    body_schema = media.schema
    choices = body_schema.one_of or [] if isinstance(body_schema, Schema) else [body_schema]
    for choice in choices:
        if isinstance(choice, Reference):
            component = schemas.get(choice.ref.rsplit("/", 1)[-1])
            if isinstance(component, Schema) and component.type == OpenAPIType.OBJECT:
                component.additional_properties = False


# Litestar decodes a date-time leniently: a number (JSON body) or numeric text (query) is
# taken as Unix time in seconds, within the years 1-9999.
_UNIX_TIME = Schema(
    type=OpenAPIType.NUMBER,
    minimum=-62135596800,
    maximum=253402300799,
    description="Unix time in seconds",
)


def _also_unix_times(node: object) -> None:
    """Document every date-time under `node` as what it accepts: RFC 3339 text or a Unix
    time. (Litestar shares the schema object of a type between documents: replace, never
    change it.)"""

    def lenient(child: object) -> object:
        if isinstance(child, Schema) and child.format == OpenAPIFormat.DATE_TIME:
            text = Schema(type=child.type, format=child.format)
            return dataclasses.replace(child, type=None, format=None, any_of=[text, _UNIX_TIME])
        _also_unix_times(child)
        return child

    if isinstance(node, dict):
        for key, value in node.items():
            node[key] = lenient(value)
    elif isinstance(node, list):
        node[:] = [lenient(value) for value in node]
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            if isinstance(value, (dict, list, Schema)) or dataclasses.is_dataclass(value):
                setattr(node, f.name, lenient(value))


async def complete_allow_header(message: Message, scope: Scope) -> None:
    """Answer OPTIONS with every method of the path. Litestar 2 builds the default OPTIONS
    handler of a path when the path's first handler is registered, so a path served by
    several handlers (GET and DELETE of one resource) listed only the first one's method
    (litestar#4169, fixed in Litestar 3 only)."""
    if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
        return
    headers = MutableScopeHeaders.from_message(message)
    handler = scope.get("route_handler")
    if handler is None or "allow" not in headers:
        return
    methods: set[str] = set()
    for path in handler.paths:
        methods.update(scope["app"].route_handler_method_map.get(path, {}))
    if methods:
        headers["Allow"] = ", ".join(sorted(methods))


def openapi_yaml(app: Litestar | None = None) -> str:
    """The OpenAPI document of the app, as YAML (what `openapi.yaml` must contain)."""
    import yaml

    schema = openapi_document(app or create_app()).to_schema()
    return yaml.safe_dump(schema, sort_keys=False, allow_unicode=True)
