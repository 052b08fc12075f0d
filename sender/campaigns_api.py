"""HTTP routes of campaigns (bulk sends): create (scope send), upload the recipient list,
start, cancel (scope send), look at them (scope read). See `sender.campaigns`."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from litestar import Controller, Request, Response, get, post, put
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)
from litestar.params import Body, HeaderParameter, Parameter

from sender import campaigns as cp
from sender.keys import IDEMPOTENCY_KEY_PATTERN, InvalidIdempotencyKey, parse_idempotency_key
from sender.schemas import (
    MULTILINE_FIELDS,
    CampaignCreated,
    CampaignPage,
    CampaignSummary,
    CampaignView,
    Category,
    Channel,
    CreateCampaign,
    Priority,
    RecipientsLoaded,
)
from sender.service import SendProblem
from suppression.api import cursor_parameter
from suppression.listing import InvalidCursor, decode_cursor, encode_cursor

MAX_CURSOR = 200
MAX_LIMIT = 500


class _Principal(Protocol):
    key_id: uuid.UUID

    def allows(self, scope: str) -> bool: ...


def provide_campaign_service(state: State) -> cp.CampaignService:
    """The process's `CampaignService`, wired by the composition root (`services.campaigns`)."""
    service: cp.CampaignService = state.services.campaigns
    return service


def _caller(request: Request[Any, Any, Any]) -> tuple[uuid.UUID, bool]:
    # Stored by the API-key guard (gateway.auth) before the handler runs.
    principal: _Principal = request.state.principal
    scopes: frozenset[str] = getattr(principal, "scopes", frozenset())
    return principal.key_id, "admin" in scopes


def _problem(problem: SendProblem) -> HTTPException:
    return HTTPException(
        status_code=problem.status,
        detail=problem.detail,
        extra={"type": problem.type, **problem.members},
    )


def _not_found(campaign_id: uuid.UUID) -> NotFoundException:
    return NotFoundException(f"No campaign {campaign_id}.")


_TEXT = Schema(type=OpenAPIType.STRING)


@dataclass
class _ListBody(Operation):
    """The recipient list's request body, read raw (Litestar cannot infer it)."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            content={
                media: OpenAPIMediaType(schema=_TEXT)
                for media in ("application/x-ndjson", "application/jsonl", "text/csv")
            },
            description=(
                'The list, streamed: JSON Lines, one `{"to": "...", "metadata": {...}}` '
                "a line (application/x-ndjson or application/jsonl), or CSV with a header line "
                "naming a `to` column, every other column becoming metadata (text/csv). At "
                f"most {cp.MAX_RECIPIENTS} records."
            ),
            required=False,
        )


_STATE_CONFLICT = ResponseSpec(
    None, description="Not allowed in the campaign's state (urn:problem:campaign-state)"
)
_NOT_FOUND = ResponseSpec(None, description="No such campaign (for this API key)")


class CampaignsController(Controller):
    """Bulk sends: one content to a list of up to a million recipients."""

    path = "/v1/campaigns"
    tags = ["campaigns"]
    dependencies = {"campaigns": Provide(provide_campaign_service, sync_to_thread=False)}

    @post(
        "/",
        opt={"scope": "send", "multiline_fields": MULTILINE_FIELDS},
        status_code=201,
        summary="Create a campaign (draft): the content of a message without recipients",
        description=(
            "The body is `POST /v1/messages`'s without `to`, validated the same way. The "
            "Idempotency-Key header is required: a repeat with the same body returns the same "
            "campaign (header Idempotent-Replayed), a different body gets 422."
        ),
        responses={
            400: ResponseSpec(
                None,
                description="Malformed body, or a missing or malformed Idempotency-Key "
                "(urn:problem:idempotency-key)",
            ),
            409: ResponseSpec(None, description="The first request with this key is in flight"),
            422: ResponseSpec(None, description="Invalid content, or key reused with another body"),
        },
    )
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: Annotated[CreateCampaign, Body(schema_extra={"additional_properties": False})],
        campaigns: cp.CampaignService,
        idempotency_key: Annotated[
            str | None,
            HeaderParameter(
                name="Idempotency-Key",
                required=True,
                description="sf-string (quoted) or bare token, 1-255 printable ASCII characters",
                schema_extra={"one_of": None, "type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            ),
        ] = None,
    ) -> Response[CampaignCreated]:
        """Create a campaign in state `draft`."""
        try:
            key = parse_idempotency_key(idempotency_key)
        except InvalidIdempotencyKey as exc:
            raise HTTPException(
                status_code=400, detail=str(exc), extra={"type": "urn:problem:idempotency-key"}
            ) from None
        client_id, _ = _caller(request)
        try:
            row, replayed = await campaigns.create(
                client_id=client_id,
                idempotency_key=key,
                request=data,
                raw_body=json.loads(await request.body()),
            )
        except SendProblem as problem:
            raise _problem(problem) from None
        headers = {"Location": f"/v1/campaigns/{row.id}"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response(
            CampaignCreated(id=row.id, state=cp.state_name(row)), status_code=201, headers=headers
        )

    @put(
        "/{campaign_id:uuid}/recipients",
        opt={"scope": "send"},
        status_code=200,
        # Streamed and inserted in batches: the size is bounded by the record count instead.
        request_max_body_size=None,
        summary="Upload (replace) the recipient list of a draft campaign, streamed",
        description=(
            "Each record is normalized like a message's recipient; invalid ones and repeats "
            "of an address are counted and left out. A second upload replaces the list; a "
            "failed one leaves the previous list as it was."
        ),
        operation_class=_ListBody,
        responses={
            400: ResponseSpec(
                None, description="The list cannot be read (e.g. a CSV without a `to` column)"
            ),
            404: _NOT_FOUND,
            409: _STATE_CONFLICT,
            413: ResponseSpec(
                None,
                description="More records than a campaign takes (urn:problem:too-many-recipients)",
            ),
            415: ResponseSpec(None, description="Neither JSON Lines nor CSV"),
        },
    )
    async def upload(
        self,
        request: Request[Any, Any, Any],
        campaign_id: uuid.UUID,
        campaigns: cp.CampaignService,
    ) -> RecipientsLoaded:
        """Replace the list with the body's records."""
        media = request.content_type[0].lower()
        fmt = cp.FORMATS.get(media)
        if fmt is None:
            raise HTTPException(
                status_code=415,
                detail="The list must be JSON Lines (application/x-ndjson, application/jsonl) "
                "or CSV (text/csv).",
                extra={"type": "urn:problem:unsupported-media-type"},
            )
        client_id, see_all = _caller(request)
        try:
            loaded = await campaigns.load_recipients(
                campaign_id,
                client_id=client_id,
                see_all=see_all,
                fmt=fmt,
                chunks=request.stream(),
            )
        except cp.NotFound:
            raise _not_found(campaign_id) from None
        except cp.BadList as exc:
            raise HTTPException(
                status_code=400, detail=str(exc), extra={"type": "urn:problem:invalid-list"}
            ) from None
        except SendProblem as problem:
            raise _problem(problem) from None
        return RecipientsLoaded(
            recipients_read=loaded.recipients_read,
            invalid=loaded.invalid,
            duplicates=loaded.duplicates,
        )

    @post(
        "/{campaign_id:uuid}/start",
        opt={"scope": "send"},
        status_code=202,
        summary="Start a draft campaign: its list is expanded into deliveries in the background",
        responses={
            404: _NOT_FOUND,
            409: ResponseSpec(
                None,
                description="Not a draft (urn:problem:campaign-state) or no recipients "
                "(urn:problem:campaign-empty)",
            ),
        },
    )
    async def start(
        self, request: Request[Any, Any, Any], campaign_id: uuid.UUID, campaigns: cp.CampaignService
    ) -> CampaignCreated:
        """`draft` -> `expanding`."""
        client_id, see_all = _caller(request)
        try:
            row = await campaigns.start(campaign_id, client_id=client_id, see_all=see_all)
        except cp.NotFound:
            raise _not_found(campaign_id) from None
        except SendProblem as problem:
            raise _problem(problem) from None
        return CampaignCreated(id=row.id, state=cp.state_name(row))

    @post(
        "/{campaign_id:uuid}/cancel",
        opt={"scope": "send"},
        status_code=200,
        summary="Cancel a campaign: no more expansion, every delivery still queued is cancelled",
        responses={404: _NOT_FOUND, 409: _STATE_CONFLICT},
    )
    async def cancel(
        self, request: Request[Any, Any, Any], campaign_id: uuid.UUID, campaigns: cp.CampaignService
    ) -> CampaignView:
        """Any state but `done` -> `cancelled` (again: no change)."""
        client_id, see_all = _caller(request)
        try:
            await campaigns.cancel(campaign_id, client_id=client_id, see_all=see_all)
        except cp.NotFound:
            raise _not_found(campaign_id) from None
        except SendProblem as problem:
            raise _problem(problem) from None
        return await _view(campaigns, campaign_id, client_id, see_all)

    @get(
        "/{campaign_id:uuid}",
        opt={"scope": "read"},
        summary="A campaign with its state and counts",
        responses={404: _NOT_FOUND},
    )
    async def show(
        self, request: Request[Any, Any, Any], campaign_id: uuid.UUID, campaigns: cp.CampaignService
    ) -> CampaignView:
        """Visible to the API key that created it, and to admin keys."""
        client_id, see_all = _caller(request)
        return await _view(campaigns, campaign_id, client_id, see_all)

    @get(
        "/",
        opt={"scope": "read"},
        summary="List campaigns, newest first (cursor pagination)",
        responses={400: ResponseSpec(None, description="Invalid cursor")},
    )
    async def list_campaigns(
        self,
        request: Request[Any, Any, Any],
        campaigns: cp.CampaignService,
        limit: Annotated[int, Parameter(ge=1, le=MAX_LIMIT)] = 50,
        cursor: Annotated[str | None, cursor_parameter(MAX_CURSOR)] = None,
    ) -> CampaignPage:
        """The API key's own campaigns (admin keys: every one)."""
        client_id, see_all = _caller(request)
        after = None
        if cursor:
            try:
                after = decode_cursor(cursor)
            except InvalidCursor as exc:
                raise HTTPException(
                    status_code=400, detail=str(exc), extra={"type": "urn:problem:invalid-cursor"}
                ) from None
        rows, more = await campaigns.list(
            client_id=client_id, see_all=see_all, after=after, limit=limit
        )
        items = [
            CampaignSummary(
                id=row.id,
                message_id=row.message_id,
                state=cp.state_name(row),
                channel=_channel(message.channel),
                category=_category(message.category),
                recipients_read=row.read_count,
                invalid=row.invalid_count,
                duplicates=row.duplicate_count,
                created_at=row.created_at,
                started_at=row.started_at,
                finished_at=row.finished_at,
            )
            for row, message in rows
        ]
        last = rows[-1][0] if rows and more else None
        return CampaignPage(
            items=items, next_cursor=encode_cursor(last.created_at, last.id) if last else None
        )


def _channel(value: str) -> Channel:
    return "sms" if value == "sms" else "email"


def _category(value: str) -> Category:
    return "marketing" if value == "marketing" else "transactional"


def _priority(value: str) -> Priority:
    return "high" if value == "high" else "low" if value == "low" else "normal"


async def _view(
    campaigns: cp.CampaignService, campaign_id: uuid.UUID, client_id: uuid.UUID, see_all: bool
) -> CampaignView:
    try:
        row, message, counts = await campaigns.show(
            campaign_id, client_id=client_id, see_all=see_all
        )
    except cp.NotFound:
        raise _not_found(campaign_id) from None
    return CampaignView(
        id=row.id,
        message_id=row.message_id,
        state=cp.state_name(row),
        channel=_channel(message.channel),
        category=_category(message.category),
        topic=message.topic,
        priority=_priority(message.priority),
        expires_at=message.expires_at,
        metadata=message.metadata or {},
        counts=counts,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )
