"""HTTP routes of the send side: `POST /v1/messages` (scope send), `GET /v1/messages/{id}`
(scope read)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Protocol

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Body, HeaderParameter

from sender.keys import IDEMPOTENCY_KEY_PATTERN, InvalidIdempotencyKey, parse_idempotency_key
from sender.schemas import MULTILINE_FIELDS, MessageCreated, MessageView, SendMessage
from sender.service import SendProblem, SendService


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


def _problem(problem: SendProblem) -> HTTPException:
    return HTTPException(
        status_code=problem.status,
        detail=problem.detail,
        extra={"type": problem.type, **problem.members},
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
            "suppressed), 202 when any was deferred (queued, retrying, unknown)."
        ),
        responses={
            202: ResponseSpec(MessageCreated, description="Accepted; some deliveries deferred"),
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
        send_service: SendService,
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
    ) -> Response[MessageCreated]:
        """Send one message (see the route description)."""
        try:
            key = parse_idempotency_key(idempotency_key)
        except InvalidIdempotencyKey as exc:
            raise HTTPException(
                status_code=400, detail=str(exc), extra={"type": "urn:problem:idempotency-key"}
            ) from None
        raw = json.loads(await request.body())
        try:
            answer = await send_service.send(
                client_id=_principal(request).key_id,
                idempotency_key=key,
                request=data,
                raw_body=raw,
            )
        except SendProblem as problem:
            raise _problem(problem) from None
        headers = {"Location": f"/v1/messages/{answer.body.id}"}
        if answer.replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response(answer.body, status_code=answer.status_code, headers=headers)

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


def _scopes(principal: _Principal) -> frozenset[str]:
    scopes: frozenset[str] = getattr(principal, "scopes", frozenset())
    return scopes
