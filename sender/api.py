"""HTTP routes of the send side: `POST /v1/messages` (scope send), `GET /v1/messages/{id}`
and the message search `GET /v1/messages` (scope read)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import ResponseHeader, State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Operation, Schema
from litestar.openapi.spec import Parameter as OpenAPIParameter
from litestar.params import Body, HeaderParameter, Parameter

from sender import log as dlog
from sender import search as finder
from sender.keys import IDEMPOTENCY_KEY_PATTERN, InvalidIdempotencyKey, parse_idempotency_key
from sender.schemas import (
    MAX_ADDRESS,
    MAX_METADATA_KEY,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE,
    MAX_TOPIC,
    MULTILINE_FIELDS,
    Category,
    Channel,
    DeliveryStatusName,
    MessageCreated,
    MessagePage,
    MessageView,
    SendMessage,
)
from sender.service import SendProblem, SendService
from suppression.api import cursor_parameter
from suppression.db import pg_of

# An optional text parameter is stated as a plain string (not `oneOf` string/null), so that
# its length bounds sit on the string itself.
_TEXT: dict[str, Any] = {"one_of": None, "type": "string"}


class _Principal(Protocol):
    key_id: uuid.UUID

    def allows(self, scope: str) -> bool: ...


def provide_send_service(state: State) -> SendService:
    """The process's `SendService`, wired by the composition root (`services.sender`)."""
    service: SendService = state.services.sender
    return service


def _principal(request: Request[Any, Any, Any]) -> _Principal:
    # Stored by the API-key guard (gateway.auth) before the handler runs.
    principal: _Principal = request.state.principal
    return principal


# RFC 9110 token characters (a preference name is a token).
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def preference_names(values: Sequence[str]) -> list[str]:
    """The preference names of `Prefer` header field values (RFC 7240 section 2), lower-case,
    in order.

    A field is a comma-separated list (several fields concatenate); each preference is
    `token [= word] *(; parameter)`, where a word may be a quoted string holding commas or
    semicolons. Values and parameters are skipped, empty list elements allowed, and an
    element whose name is not a token is ignored (a server ignores what it does not know).
    """
    names: list[str] = []
    for value in values:
        element: list[str] = []
        quoted = escaped = False
        for ch in value + ",":
            if quoted:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    quoted = False
                element.append(ch)
            elif ch == '"':
                quoted = True
                element.append(ch)
            elif ch == ",":
                name = "".join(element).split(";", 1)[0].split("=", 1)[0].strip(" \t")
                if name and all(c in _TOKEN for c in name):
                    names.append(name.lower())
                element = []
            else:
                element.append(ch)
    return names


def _problem(problem: SendProblem) -> HTTPException:
    return HTTPException(
        status_code=problem.status,
        detail=problem.detail,
        extra={"type": problem.type, **problem.members},
    )


@dataclass
class _SearchOperation(Operation):
    """The search's operation, with the `metadata[key]=value` filters Litestar cannot infer
    (the handler reads them from the query string itself)."""

    def __post_init__(self) -> None:
        self.parameters = [
            *(self.parameters or []),
            OpenAPIParameter(
                name="metadata",
                param_in="query",
                required=False,
                style="deepObject",
                explode=True,
                description="`metadata[key]=value`: messages whose metadata has all these pairs",
                schema=Schema(
                    type=OpenAPIType.OBJECT,
                    max_properties=MAX_METADATA_KEYS,
                    property_names=Schema(
                        type=OpenAPIType.STRING, min_length=1, max_length=MAX_METADATA_KEY
                    ),
                    additional_properties=Schema(
                        type=OpenAPIType.STRING, max_length=MAX_METADATA_VALUE
                    ),
                ),
            ),
        ]


def _search_problem(problem: finder.SearchProblem) -> HTTPException:
    return HTTPException(
        status_code=problem.status, detail=str(problem), extra={"type": problem.type}
    )


class MessagesController(Controller):
    """Send messages and look at what became of them."""

    path = "/v1/messages"
    tags = ["messages"]
    dependencies = {"send_service": Provide(provide_send_service, sync_to_thread=False)}

    @post(
        "/",
        # `multiline_fields`: see gateway.inputs (the input gate every route passes).
        opt={"scope": "send", "multiline_fields": MULTILINE_FIELDS},
        status_code=201,
        summary="Send a message to 1-100 recipients",
        description=(
            "Each recipient becomes its own delivery and its own provider call. The "
            "Idempotency-Key header is required (IETF draft semantics, scoped per API key): "
            "a repeat with the same body returns the stored answer with its original status "
            "code; a different body gets 422; a repeat while the first is in flight gets 409. "
            "201 when every delivery has a final answer for its first attempt (sent, failed, "
            "suppressed), 202 when any was deferred (queued, retrying, unknown). "
            "With `Prefer: respond-async` (RFC 7240), or for `category: marketing` when the "
            "gateway runs with GATEWAY_MARKETING_ASYNC=true, the request is accepted "
            "asynchronously: 202 as soon as the message and its deliveries are stored, each "
            "delivery `queued` (sent by the workers, highest priority first) or `suppressed`; "
            "`Preference-Applied: respond-async` says the preference was honoured."
        ),
        response_headers=[
            ResponseHeader(
                name="Preference-Applied",
                description="`respond-async` when the request's preference was applied (RFC 7240)",
                documentation_only=True,
                required=False,
            )
        ],
        responses={
            202: ResponseSpec(
                MessageCreated,
                description="Accepted; some deliveries deferred, or accepted asynchronously "
                "(every delivery queued or suppressed)",
            ),
            400: ResponseSpec(
                None,
                description="Malformed body, or a missing or malformed Idempotency-Key "
                "(urn:problem:idempotency-key)",
            ),
            409: ResponseSpec(None, description="The first request with this key is in flight"),
            422: ResponseSpec(
                None, description="Invalid recipient or content, or key reused with another body"
            ),
        },
    )
    async def create(
        self,
        request: Request[Any, Any, Any],
        # SendMessage refuses unknown members (forbid_unknown_fields); Litestar does not say so.
        data: Annotated[SendMessage, Body(schema_extra={"additional_properties": False})],
        idempotency_key: Annotated[
            str | None,
            # Checked by the handler (400 urn:problem:idempotency-key when missing or bad).
            HeaderParameter(
                name="Idempotency-Key",
                required=True,
                description="sf-string (quoted) or bare token, 1-255 printable ASCII characters",
                schema_extra={"one_of": None, "type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            ),
        ] = None,
        prefer: Annotated[
            str | None,
            # Read from the raw headers (every Prefer field); declared for the documentation.
            HeaderParameter(
                name="Prefer",
                required=False,
                description="RFC 7240 preferences; `respond-async` asks for asynchronous "
                "acceptance (202 once stored). Other preferences are ignored.",
                max_length=1024,
                schema_extra={"one_of": None, "type": "string"},
            ),
        ] = None,
    ) -> Response[MessageCreated]:
        """Send one message (see the route description)."""
        try:
            key = parse_idempotency_key(idempotency_key)
        except InvalidIdempotencyKey as exc:
            raise HTTPException(
                status_code=400, detail=str(exc), extra={"type": "urn:problem:idempotency-key"}
            ) from None
        raw = json.loads(await request.body())
        asked_async = "respond-async" in preference_names(request.headers.getall("prefer", []))
        # The service is taken from the app's state rather than injected: this route is the
        # hottest, and Litestar's dependency resolution cost it ~2 % of its CPU.
        send_service = provide_send_service(request.app.state)
        try:
            answer = await send_service.send(
                client_id=_principal(request).key_id,
                idempotency_key=key,
                request=data,
                raw_body=raw,
                prefer_async=asked_async,
            )
        except SendProblem as problem:
            raise _problem(problem) from None
        headers = {"Location": f"/v1/messages/{answer.body.id}"}
        if answer.replayed:
            headers["Idempotent-Replayed"] = "true"
        # A replay is the stored answer: a 202 to a client asking for respond-async says the
        # preference holds for it (the deliveries are the workers' business either way).
        if asked_async and (answer.asynchronous or (answer.replayed and answer.status_code == 202)):
            headers["Preference-Applied"] = "respond-async"
        return Response(answer.body, status_code=answer.status_code, headers=headers)

    @get(
        "/",
        opt={"scope": "read"},
        operation_class=_SearchOperation,
        summary="Search messages (newest first, cursor pagination)",
        description=(
            "The key's own messages (every client's for admin keys), newest first, with their "
            "deliveries' statuses. `to` matches one recipient exactly, by the keyed hash of "
            "the address normalized as a send normalizes it (with `channel`, or guessed: "
            "an address with `@` is email, anything else a phone number). `status` matches "
            "messages with a delivery in that status; `since`/`until` bound the creation "
            "time (inclusive/exclusive); `metadata[key]=value` filters on the send's metadata."
        ),
        responses={
            400: ResponseSpec(
                None,
                description="A malformed parameter, cursor (urn:problem:invalid-cursor) or "
                "metadata filter (urn:problem:invalid-query)",
            ),
            422: ResponseSpec(
                None, description="`to` is not a valid address (urn:problem:invalid-address)"
            ),
        },
    )
    async def find(
        self,
        request: Request[Any, Any, Any],
        send_service: SendService,
        to: Annotated[
            str | None, Parameter(min_length=1, max_length=MAX_ADDRESS, schema_extra=_TEXT)
        ] = None,
        status: DeliveryStatusName | None = None,
        channel: Channel | None = None,
        category: Category | None = None,
        topic: Annotated[
            str | None, Parameter(min_length=1, max_length=MAX_TOPIC, schema_extra=_TEXT)
        ] = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        cursor: Annotated[str | None, cursor_parameter(finder.MAX_CURSOR)] = None,
        limit: Annotated[int, Parameter(ge=1, le=finder.MAX_LIMIT)] = finder.DEFAULT_LIMIT,
    ) -> MessagePage:
        """Find messages (see the route description)."""
        principal = _principal(request)
        try:
            where = dlog.MessageFilter(
                client_id=None if "admin" in _scopes(principal) else principal.key_id,
                recipient=(
                    finder.recipient_filter(
                        send_service.protector,
                        to,
                        channel,
                        send_service.config.default_region,
                    )
                    if to is not None
                    else None
                ),
                status=status,
                channel=channel,
                category=category,
                topic=topic,
                since=_aware(since),
                until=_aware(until),
                metadata=finder.metadata_filter(request.query_params),
                before=finder.decode_cursor(cursor) if cursor is not None else None,
            )
        except finder.SearchProblem as problem:
            raise _search_problem(problem) from None
        async with send_service.sessions() as session:
            conn = await pg_of(session)
            return await finder.search(conn, send_service.protector, where, limit=limit)

    @get(
        "/{message_id:uuid}",
        opt={"scope": "read"},
        summary="A message with its deliveries, attempts, provider events and suppressions",
        responses={404: ResponseSpec(None, description="No such message (for this API key)")},
    )
    async def show(
        self, request: Request[Any, Any, Any], message_id: uuid.UUID, send_service: SendService
    ) -> MessageView:
        """Messages are visible to the API key that sent them, and to admin keys."""
        principal = _principal(request)
        view = await send_service.view(
            message_id, client_id=principal.key_id, see_all="admin" in _scopes(principal)
        )
        if view is None:
            raise NotFoundException(f"No message {message_id}.")
        return view


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    """A time without a zone is taken as UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _scopes(principal: _Principal) -> frozenset[str]:
    scopes: frozenset[str] = getattr(principal, "scopes", frozenset())
    return scopes
