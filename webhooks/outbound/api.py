"""HTTP routes of outbound webhooks (scope `admin`): `/v1/webhook-endpoints`.

The composition root hands in the `Endpoints` operations (`services.webhook_endpoints`).
Status codes: an unsafe URL (not https, or a host that resolves to a loopback, private,
link-local, metadata, ... address), an unknown event type or an unknown API key in a
well-formed body is 422 (`urn:problem:invalid-endpoint`); a malformed body 400; an unknown
endpoint id 404.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Request, delete, get, patch, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import ClientException, HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import Parameter

from webhooks.outbound import store
from webhooks.outbound.endpoints import (
    EndpointNotFound,
    Endpoints,
    InvalidEndpoint,
    ReplayResult,
    TestResult,
)
from webhooks.outbound.policy import ALL_EVENTS, EVENT_TYPES
from webhooks.outbound.ssrf import MAX_URL_LENGTH

DeliveryStatusName = Literal["pending", "delivered", "failed"]
DisabledReasonName = Literal["operator", "failing"]

MAX_DESCRIPTION = 1000
MAX_EVENTS = 32
MAX_EVENT_TYPE = 64
INVALID_ENDPOINT = "urn:problem:invalid-endpoint"

_EVENTS_SCHEMA = {
    "items": Schema(type=OpenAPIType.STRING, enum=[ALL_EVENTS, *EVENT_TYPES]),
}
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_URL_LENGTH)]
Description = Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION)]
EventTypes = Annotated[
    list[Annotated[str, msgspec.Meta(max_length=MAX_EVENT_TYPE)]],
    msgspec.Meta(max_length=MAX_EVENTS),
    Parameter(min_items=1, schema_extra=_EVENTS_SCHEMA),
]


class WebhookEndpointCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/webhook-endpoints`: where to push, which event types (or `*`), a
    description for operators, and whose events (an API key id; default: the creating key)."""

    url: Url
    events: EventTypes
    description: Description = ""
    api_key_id: uuid.UUID | None = None


class WebhookEndpointChange(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `PATCH /v1/webhook-endpoints/{id}`: what to change (an absent member stays)."""

    url: Url | None = None
    events: EventTypes | None = None
    description: Description | None = None
    enabled: bool | None = None


class WebhookReplayRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/webhook-endpoints/{id}/replay`: send again every event since then."""

    since: dt.datetime


@dataclass
class WebhookEndpointView:
    """An endpoint as operators see it (never its secret)."""

    id: uuid.UUID
    url: str
    description: str
    events: list[str]
    api_key_id: uuid.UUID
    enabled: bool
    # Why and since when it is disabled (`failing`: every try failed for the failure window).
    disabled_reason: DisabledReasonName | None
    disabled_since: dt.datetime | None
    # Since when every try has failed (None while it answers).
    failing_since: dt.datetime | None
    # Until when the previous secret signs beside the current one (after a rotation).
    previous_secret_expires_at: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass
class WebhookEndpointSecretView(WebhookEndpointView):
    """The answers that carry the signing secret (creation, rotation): shown this once."""

    secret: str = ""


@dataclass
class WebhookAttemptView:
    """One try of one event: the answer's status code (None without one), the latency, the
    error (None for a 2xx), and where the event's delivery stands now."""

    id: uuid.UUID
    event_id: str
    event_type: str
    attempted_at: dt.datetime
    status_code: int | None
    latency_ms: int
    error: str | None
    delivery_status: DeliveryStatusName


@dataclass
class WebhookTestView:
    """What the endpoint answered to a `ping` event."""

    event_id: str
    delivered: bool
    status_code: int | None
    latency_ms: int
    error: str | None


@dataclass
class WebhookReplayView:
    """How many events are sent again; `next_since` is set when the replay stopped at its
    limit (replay again from there for the rest)."""

    replayed: int
    next_since: dt.datetime | None


def endpoint_view(row: store.EndpointRow) -> WebhookEndpointView:
    """The API view of an endpoint."""
    return WebhookEndpointView(
        id=row.id,
        url=row.url,
        description=row.description,
        events=row.events,
        api_key_id=row.api_key_id,
        enabled=row.enabled,
        disabled_reason=row.disabled_reason,  # type: ignore[arg-type]
        disabled_since=row.disabled_at if not row.enabled else None,
        failing_since=row.failing_since,
        previous_secret_expires_at=row.previous_secret_expires_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _with_secret(row: store.EndpointRow, secret: str) -> WebhookEndpointSecretView:
    return WebhookEndpointSecretView(**vars(endpoint_view(row)), secret=secret)


def provide_endpoints(state: State) -> Endpoints:
    """The process's endpoint operations (`services.webhook_endpoints`)."""
    endpoints: Endpoints = state.services.webhook_endpoints
    return endpoints


def _invalid(exc: InvalidEndpoint) -> HTTPException:
    return HTTPException(status_code=422, detail=str(exc), extra={"type": INVALID_ENDPOINT})


def _not_found(endpoint_id: uuid.UUID) -> NotFoundException:
    return NotFoundException(f"No webhook endpoint {endpoint_id}.")


def _utc(value: dt.datetime) -> dt.datetime:
    # A time without a zone is UTC; one that UTC cannot represent is the client's mistake.
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ClientException(f"time out of range: {value.isoformat()}") from None


_NOT_FOUND = ResponseSpec(None, description="No endpoint has this id")
_INVALID = ResponseSpec(
    None,
    description="The URL is not https or resolves to a forbidden (loopback, private, "
    "link-local, metadata, ...) address, an event type is unknown, or the API key is not "
    "active (urn:problem:invalid-endpoint)",
)


class WebhookEndpointsController(Controller):
    """Endpoints that receive the gateway's events, signed per Standard Webhooks."""

    path = "/v1/webhook-endpoints"
    tags = ["webhook endpoints"]
    opt = {"scope": "admin"}
    dependencies = {"endpoints": Provide(provide_endpoints, sync_to_thread=False)}

    @post(
        "/",
        status_code=201,
        summary="Create an endpoint (the signing secret is returned once)",
        responses={422: _INVALID},
    )
    async def create(
        self, request: Request[Any, Any, Any], data: WebhookEndpointCreate, endpoints: Endpoints
    ) -> WebhookEndpointSecretView:
        """Create an enabled endpoint that receives the events from now on."""
        api_key_id = data.api_key_id or request.state.principal.key_id
        try:
            row, secret = await endpoints.create(
                url=data.url,
                events=data.events,
                description=data.description,
                api_key_id=api_key_id,
            )
        except InvalidEndpoint as exc:
            raise _invalid(exc) from None
        return _with_secret(row, secret)

    @get("/", summary="List endpoints")
    async def list_endpoints(self, endpoints: Endpoints) -> list[WebhookEndpointView]:
        """Every endpoint, oldest first."""
        return [endpoint_view(r) for r in await endpoints.list_all()]

    @get("/{endpoint_id:uuid}", summary="Show an endpoint", responses={404: _NOT_FOUND})
    async def show(self, endpoint_id: uuid.UUID, endpoints: Endpoints) -> WebhookEndpointView:
        """One endpoint, with why and since when it is disabled, if it is."""
        try:
            return endpoint_view(await endpoints.get(endpoint_id))
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None

    @patch(
        "/{endpoint_id:uuid}",
        summary="Change an endpoint (URL, events, description; enable or disable)",
        responses={404: _NOT_FOUND, 422: _INVALID},
    )
    async def change(
        self, endpoint_id: uuid.UUID, data: WebhookEndpointChange, endpoints: Endpoints
    ) -> WebhookEndpointView:
        """Change what the body gives. `enabled: false` disables it (reason `operator`);
        `enabled: true` enables it again, from the feed's current end (what happened while
        it was disabled is sent only by a replay)."""
        try:
            row = await endpoints.update(
                endpoint_id,
                url=data.url,
                description=data.description,
                events=data.events,
                enabled=data.enabled,
            )
        except InvalidEndpoint as exc:
            raise _invalid(exc) from None
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None
        return endpoint_view(row)

    @delete("/{endpoint_id:uuid}", summary="Delete an endpoint", responses={404: _NOT_FOUND})
    async def remove(self, endpoint_id: uuid.UUID, endpoints: Endpoints) -> None:
        """Delete the endpoint with its pending deliveries and its tries."""
        try:
            await endpoints.delete(endpoint_id)
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None

    @post(
        "/{endpoint_id:uuid}/rotate-secret",
        status_code=200,
        summary="Rotate the signing secret (the old one signs beside it for 24 hours)",
        responses={404: _NOT_FOUND},
    )
    async def rotate(
        self, endpoint_id: uuid.UUID, endpoints: Endpoints
    ) -> WebhookEndpointSecretView:
        """A new secret, returned once. For 24 hours every push carries two signatures in
        `webhook-signature`, one by the new secret and one by the old, space-separated."""
        try:
            row, secret = await endpoints.rotate_secret(endpoint_id)
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None
        return _with_secret(row, secret)

    @post(
        "/{endpoint_id:uuid}/test",
        status_code=200,
        summary="Send a ping event now and show the answer",
        responses={404: _NOT_FOUND},
    )
    async def test(self, endpoint_id: uuid.UUID, endpoints: Endpoints) -> WebhookTestView:
        """One signed `ping` try (no retry), to a disabled endpoint too."""
        try:
            result: TestResult = await endpoints.test(endpoint_id)
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None
        return WebhookTestView(
            result.event_id, result.delivered, result.status_code, result.latency_ms, result.error
        )

    @get(
        "/{endpoint_id:uuid}/attempts",
        summary="Recent tries (status code, latency, error), newest first",
        responses={404: _NOT_FOUND},
    )
    async def attempts(
        self,
        endpoint_id: uuid.UUID,
        endpoints: Endpoints,
        limit: Annotated[int, Parameter(ge=1, le=500)] = 50,
        before: Annotated[
            dt.datetime | None,
            Parameter(description="Only tries before this time (the last one listed: paging)"),
        ] = None,
    ) -> list[WebhookAttemptView]:
        """The endpoint's most recent tries."""
        try:
            rows = await endpoints.attempts(
                endpoint_id, limit=limit, before=_utc(before) if before else None
            )
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None
        return [
            WebhookAttemptView(
                r.id,
                r.event_id,
                r.event_type,
                r.attempted_at,
                r.status_code,
                r.latency_ms,
                r.error,
                r.delivery_status,  # type: ignore[arg-type]
            )
            for r in rows
        ]

    @post(
        "/{endpoint_id:uuid}/replay",
        status_code=200,
        summary="Send again every event since a time",
        responses={404: _NOT_FOUND},
    )
    async def replay(
        self, endpoint_id: uuid.UUID, data: WebhookReplayRequest, endpoints: Endpoints
    ) -> WebhookReplayView:
        """Every event since `since` that the endpoint subscribes to and its key may see
        (delivered, failed, or never sent to it) is pushed again, with the same
        `webhook-id`, at most 10,000 per request."""
        try:
            result: ReplayResult = await endpoints.replay(endpoint_id, since=_utc(data.since))
        except EndpointNotFound:
            raise _not_found(endpoint_id) from None
        return WebhookReplayView(result.replayed, result.next_since)


ROUTES = [WebhookEndpointsController]
