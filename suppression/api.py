"""HTTP routes of the suppression list and of one-click unsubscribe.

The composition root hands in a `SuppressionContext` (in `services.extra["suppression"]`):
the protector, a session factory for streaming work, the default phone region, and how to name
the authenticated caller in history. `suppression` imports no other package.

Status codes: invalid addresses, reasons or scopes in a well-formed request are 422; missing or
malformed parameters and bodies are 400; removing a `complaint` or `sms_stop` entry without
`force=true` is 409 (the caller may do it, but must say so explicitly).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import parse_qsl

import msgspec
from litestar import Controller, MediaType, Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
)
from litestar.params import Parameter, ParameterKwarg, QueryParameter
from litestar.response import Stream
from litestar.types import ExceptionHandlersMap
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from suppression import service
from suppression.crypto import AddressProtector
from suppression.db import pg_connection
from suppression.exporter import export_chunks
from suppression.formats import (
    EXPORT_FORMATS,
    IMPORT_FORMATS,
    SENDGRID_LISTS,
    ImportOptions,
    UnrecognizedFormat,
)
from suppression.importer import MAX_REPORTED_INVALID, run_import
from suppression.listing import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Filters,
    InvalidCursor,
    decode_cursor,
    encode_cursor,
    page,
)
from suppression.normalize import CHANNELS, Address, InvalidAddress, normalize
from suppression.tokens import InvalidUnsubscribeToken, UnsubscribeToken, read_token
from suppression.unsubscribe import (
    ONE_CLICK_FIELD,
    ONE_CLICK_VALUE,
    PAGE_HEADERS,
    apply_unsubscribe,
    confirmation_page,
    done_page,
    invalid_link_page,
)
from suppression.views import EntryView, HistoryView, entry_view, history_view

# A free-text parameter that must say something: not only white space, no C0 control
# character (gateway.inputs refuses those in every query parameter).
SOME_TEXT = r"^[^\x00-\x1f]*[^\s\x00-\x1f\x85][^\x00-\x1f]*$"

MAX_CHECK_ADDRESSES = 10_000
UNSUBSCRIBE_RETRY_AFTER_SECONDS = 60

log = logging.getLogger("gateway.suppression")

# --- what the OpenAPI document states (the handlers check the same rules) ----------------------
# Error responses are problem documents (the composition root says so for every route). On
# handler parameters, constraints go in `schema_extra` only: Litestar would enforce a
# `pattern=` itself, with a generic validation problem instead of the handler's own.


def cursor_parameter(max_length: int) -> ParameterKwarg:
    """The opaque page cursor of a list route (`cursor`, or the feed's `after`): the
    `next_cursor` of the previous page, at most `max_length` characters."""
    parameter: ParameterKwarg = Parameter(
        description="`next_cursor` of the previous page (opaque)",
        max_length=max_length,
        schema_extra={"one_of": None, "type": "string"},
    )
    return parameter


def _one_of(values: tuple[str, ...]) -> ParameterKwarg:
    """A text parameter or field that takes one of `values`."""
    extra = {"one_of": None, "type": "string", "enum": list(values)}
    parameter: ParameterKwarg = Parameter(schema_extra=extra)
    return parameter


_CHANNEL = _one_of(CHANNELS)
_SCOPE = Parameter(schema_extra={"one_of": None, "type": "string"}, pattern=service.SCOPE_PATTERN)
_INVALID_ADDRESS = ResponseSpec(
    None, description="Not a valid address for the channel (urn:problem:invalid-address)"
)
_TEXT = Schema(type=OpenAPIType.STRING)


def _operation(
    *,
    body: dict[str, Schema] | None = None,
    body_description: str | None = None,
    body_required: bool = True,
    ok: dict[str, Schema] | None = None,
) -> type[Operation]:
    """An OpenAPI operation with what Litestar cannot infer from a handler that reads its
    body raw (`body`: media type -> schema) or answers in several media types (`ok`)."""

    @dataclass
    class _Documented(Operation):
        def __post_init__(self) -> None:
            if body is not None:
                content = {media: OpenAPIMediaType(schema=schema) for media, schema in body.items()}
                self.request_body = RequestBody(
                    content=content, description=body_description, required=body_required
                )
            if ok is not None and self.responses is not None:
                response = self.responses["200"]
                assert not isinstance(response, Reference)
                response.content = {
                    media: OpenAPIMediaType(schema=schema) for media, schema in ok.items()
                }

    return _Documented


_ONE_CLICK_FORM = Schema(
    type=OpenAPIType.OBJECT,
    properties={ONE_CLICK_FIELD: Schema(type=OpenAPIType.STRING, enum=[ONE_CLICK_VALUE])},
    required=[ONE_CLICK_FIELD],
)


@dataclass(frozen=True)
class SuppressionContext:
    """What the suppression routes need from the composition root."""

    protector: AddressProtector
    sessions: async_sessionmaker[AsyncSession]
    default_region: str
    # The authenticated caller as written to history (e.g. "api_key:<id>").
    actor_of: Callable[[Request[Any, Any, Any]], str]

    @property
    def engine(self) -> AsyncEngine:
        """The engine the session factory is bound to (hot paths take asyncpg connections
        from its pool directly)."""
        engine = self.sessions.kw["bind"]
        assert isinstance(engine, AsyncEngine)
        return engine


def provide_context(state: State) -> SuppressionContext:
    """The context the composition root stored for this package."""
    context: SuppressionContext = state.services.suppression
    return context


DEPENDENCIES = {"suppression": Provide(provide_context, sync_to_thread=False)}


# --- request and response bodies ----------------------------------------------------------------


@dataclass
class SuppressionPage:
    """One page of the list; pass `next_cursor` back as `cursor` for the next one."""

    items: list[EntryView]
    next_cursor: str | None


@dataclass
class AddressSuppressions:
    """Everything on the list about one address: its entries and their whole history."""

    channel: str
    address: str
    suppressed: bool
    entries: list[EntryView]
    history: list[HistoryView]


MAX_ADDRESS = 320
MAX_WORD = 64
MAX_SCOPE = 128
MAX_CURSOR = 512
MAX_REMOVAL_REASON = 1000

_Address = Annotated[str, msgspec.Meta(max_length=MAX_ADDRESS)]


class SuppressionCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/suppressions` (manual add); unknown fields are refused."""

    # Enumerated and patterned fields are bounded by the handler's checks (400/422).
    channel: Annotated[str, _CHANNEL]
    address: _Address
    reason: Annotated[str, _one_of(service.REASONS)]
    scope: Annotated[str, _SCOPE] = service.SCOPE_ALL
    expires_at: dt.datetime | None = None


@dataclass
class SuppressionCreated:
    """The entry, and whether this request created it (false: it was already there)."""

    created: bool
    entry: EntryView


@dataclass
class SuppressionsRemoved:
    """The entries a DELETE removed."""

    removed: list[EntryView]


class CheckRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/suppressions/check`: up to 10,000 addresses of one channel.

    `category` and `topic` are those of the intended message: `transactional` ignores topic
    unsubscribes; a marketing message without a topic is checked against `marketing`.
    """

    # Enumerated and patterned fields are bounded by the handler's checks (400/422).
    channel: Annotated[str, _CHANNEL]
    addresses: Annotated[list[_Address], Parameter(max_items=MAX_CHECK_ADDRESSES)]
    category: Annotated[str, _one_of(("transactional", "marketing"))] = "marketing"
    topic: Annotated[str | None, Parameter(pattern=service.SCOPE_PATTERN)] = None


@dataclass
class CheckHit:
    """A suppressed address (as it was given) and the entry that suppresses it."""

    address: str
    reason: str
    scope: str
    created_at: dt.datetime
    expires_at: dt.datetime | None


@dataclass
class CheckInvalid:
    """An address that is not valid for the channel."""

    address: str
    error: str


@dataclass
class CheckResult:
    """The suppressed and the invalid addresses; every other one may be sent to."""

    suppressed: list[CheckHit]
    invalid: list[CheckInvalid] = field(default_factory=list)


@dataclass
class InvalidRow:
    """A row an import skipped."""

    line: int
    error: str


@dataclass
class ImportResult:
    """Outcome of an import; `invalid` lists at most the first 100 invalid rows."""

    import_id: uuid.UUID
    added: int
    already_present: int
    invalid_count: int
    invalid: list[InvalidRow]


# --- helpers ------------------------------------------------------------------------------------


def _problem(status: int, type_: str, detail: str, **extra: Any) -> HTTPException:
    return HTTPException(status_code=status, detail=detail, extra={"type": type_, **extra})


def _channel(channel: str) -> str:
    if channel not in CHANNELS:
        raise _problem(
            400, "urn:problem:unknown-channel", f"channel must be one of {', '.join(CHANNELS)}"
        )
    return channel


def _address(
    context: SuppressionContext, channel: str, raw: str, *, strict: bool = False
) -> Address:
    # `strict` for new entries (a valid number, not only a possible one); look-ups and
    # removals stay lenient so that anything stored can be found again.
    try:
        return normalize(_channel(channel), raw, context.default_region, strict=strict)
    except InvalidAddress as exc:
        raise _problem(
            422, "urn:problem:invalid-address", f"not a valid {channel} address: {exc.problem}"
        ) from None


def _time(value: dt.datetime | None, name: str, status: int = 400) -> dt.datetime | None:
    """A query/body time as UTC; a time at the calendar's edge with an offset (year 1 at
    +14:00) parses but has no UTC equivalent, and must be refused here rather than overflow
    in the database driver (a 500)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise _problem(status, "urn:problem:invalid-parameter", f"{name} is out of range") from None


def _reason_filter(reason: str | None) -> str | None:
    if reason is not None and reason not in service.REASONS:
        raise _problem(
            400,
            "urn:problem:invalid-parameter",
            f"reason must be one of {', '.join(service.REASONS)}",
        )
    return reason


def _scope_value(scope: str | None, name: str = "scope", status: int = 400) -> str | None:
    # The same rule as stored scopes (`validate_entry`); also keeps NUL and other characters
    # PostgreSQL text cannot hold out of queries.
    if scope is None:
        return None
    try:
        service.validate_entry("email", "manual", scope)
    except ValueError as exc:
        raise _problem(status, "urn:problem:invalid-parameter", f"{name}: {exc}") from None
    return scope


def _entry(channel: str, reason: str, scope: str) -> None:
    try:
        service.validate_entry(channel, reason, scope)
    except ValueError as exc:
        raise _problem(422, "urn:problem:invalid-suppression", str(exc)) from None


# --- the list -----------------------------------------------------------------------------------


class SuppressionsController(Controller):
    """The suppression list: look-ups, manual changes, bulk check, import and export."""

    path = "/v1/suppressions"
    tags = ["suppressions"]
    dependencies = DEPENDENCIES

    @get("/", opt={"scope": "read"}, summary="List suppressions (cursor pagination)")
    async def list_entries(
        self,
        db_session: AsyncSession,
        suppression: SuppressionContext,
        channel: Annotated[str | None, _CHANNEL, Parameter(max_length=MAX_WORD)] = None,
        reason: Annotated[
            str | None, _one_of(service.REASONS), Parameter(max_length=MAX_WORD)
        ] = None,
        # `scope` is a reserved handler argument in Litestar (the ASGI scope), hence the alias.
        entry_scope: Annotated[
            str | None,
            QueryParameter(
                name="scope",
                max_length=MAX_SCOPE,
                schema_extra={"one_of": None, "type": "string", "pattern": service.SCOPE_PATTERN},
            ),
        ] = None,
        since: dt.datetime | None = None,
        cursor: Annotated[str | None, cursor_parameter(MAX_CURSOR)] = None,
        limit: Annotated[int, Parameter(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    ) -> SuppressionPage:
        """Entries oldest first, filtered by channel, reason, scope and creation time."""
        if channel is not None:
            _channel(channel)
        after = None
        if cursor:
            try:
                after = decode_cursor(cursor)
            except InvalidCursor as exc:
                raise _problem(400, "urn:problem:invalid-cursor", str(exc)) from None
        filters = Filters(
            channel,
            _reason_filter(reason),
            _scope_value(entry_scope),
            _time(since, "since"),
        )
        rows, last = await page(db_session, filters, after=after, limit=limit)
        now = dt.datetime.now(dt.UTC)
        return SuppressionPage(
            items=[entry_view(suppression.protector, row, now) for row in rows],
            next_cursor=encode_cursor(*last) if last else None,
        )

    @get(
        "/{channel:str}/{address:str}",
        opt={"scope": "read"},
        summary="Entries of one address",
        responses={422: _INVALID_ADDRESS},
    )
    async def get_address(
        self,
        channel: Annotated[str, _CHANNEL],
        address: str,
        db_session: AsyncSession,
        suppression: SuppressionContext,
    ) -> AddressSuppressions:
        """The entries of one address (any scope, expired ones too) and its whole history."""
        normalized = _address(suppression, channel, address)
        address_hash = suppression.protector.hash(channel, normalized.key)
        rows = await service.entries_for(db_session, channel, address_hash)
        history = await service.history_for(db_session, channel, address_hash)
        now = dt.datetime.now(dt.UTC)
        entries = [entry_view(suppression.protector, row, now) for row in rows]
        return AddressSuppressions(
            channel=channel,
            address=normalized.key,
            suppressed=any(e.active for e in entries),
            entries=entries,
            history=[history_view(h) for h in history],
        )

    @post(
        "/",
        opt={"scope": "admin"},
        summary="Add a suppression manually",
        responses={
            200: ResponseSpec(
                SuppressionCreated, description="An active entry existed already (created: false)"
            ),
            422: ResponseSpec(
                None,
                description="Invalid address (urn:problem:invalid-address), or a reason, scope "
                "or expiry that do not fit together (urn:problem:invalid-suppression)",
            ),
        },
    )
    async def create(
        self,
        data: SuppressionCreate,
        request: Request[Any, Any, Any],
        db_session: AsyncSession,
        suppression: SuppressionContext,
    ) -> Response[SuppressionCreated]:
        """Add an entry (201), or return the existing active one (200)."""
        address = _address(suppression, data.channel, data.address, strict=True)
        _entry(data.channel, data.reason, data.scope)
        if data.expires_at is not None:
            if data.expires_at.tzinfo is not None:
                _time(data.expires_at, "expires_at", 422)
            if data.expires_at.tzinfo is None:
                problem = "expires_at needs a time zone"
            elif data.expires_at <= dt.datetime.now(dt.UTC):
                problem = "expires_at is in the past"
            else:
                problem = ""
            if problem:
                raise _problem(422, "urn:problem:invalid-suppression", problem)
        actor = suppression.actor_of(request)
        row, created = await service.add(
            db_session,
            suppression.protector,
            address,
            reason=data.reason,
            scope=data.scope,
            expires_at=data.expires_at,
            source=service.Source("operator", actor, actor=actor),
        )
        await db_session.commit()
        body = SuppressionCreated(created, entry_view(suppression.protector, row))
        return Response(body, status_code=201 if created else 200)

    @delete(
        "/{channel:str}/{address:str}",
        opt={"scope": "admin"},
        status_code=200,
        summary="Remove suppressions of one address (reason required)",
        responses={
            404: ResponseSpec(None, description="No entry matches this address and scope"),
            409: ResponseSpec(
                None,
                description="A complaint or sms_stop entry, and no force=true "
                "(urn:problem:protected-suppression)",
            ),
            422: _INVALID_ADDRESS,
        },
    )
    async def remove(
        self,
        channel: Annotated[str, _CHANNEL],
        address: str,
        request: Request[Any, Any, Any],
        db_session: AsyncSession,
        suppression: SuppressionContext,
        # Checked by the handler, so that its absence is the documented
        # urn:problem:removal-reason-required rather than a generic validation error.
        reason: Annotated[
            str | None,
            Parameter(
                description="Why the entry is removed.",
                required=True,
                max_length=MAX_REMOVAL_REASON,
                # Some text: not empty, not only white space.
                schema_extra={"one_of": None, "type": "string", "pattern": SOME_TEXT},
            ),
        ] = None,
        entry_scope: Annotated[
            str | None,
            QueryParameter(
                name="scope",
                description="Only this scope (default: every scope).",
                max_length=MAX_SCOPE,
                schema_extra={"one_of": None, "type": "string", "pattern": service.SCOPE_PATTERN},
            ),
        ] = None,
        force: Annotated[
            bool, Parameter(description="Required to remove complaint or sms_stop entries.")
        ] = False,
    ) -> SuppressionsRemoved:
        """Remove entries; complaint and sms_stop entries need `force=true` (else 409)."""
        if not reason or not reason.strip() or "\x00" in reason:
            raise _problem(
                400,
                "urn:problem:removal-reason-required",
                "A reason query parameter (text) is required to remove a suppression.",
            )
        _scope_value(entry_scope)
        normalized = _address(suppression, channel, address)
        address_hash = suppression.protector.hash(channel, normalized.key)
        try:
            removed = await service.remove_by_operator(
                db_session,
                channel,
                address_hash,
                reason=reason,
                actor=suppression.actor_of(request),
                scope=entry_scope,
                force=force,
                address=normalized,
            )
        except service.NothingToRemove:
            raise NotFoundException("No suppression matches this address and scope.") from None
        except service.ProtectedSuppression as exc:
            raise _problem(
                409,
                "urn:problem:protected-suppression",
                "Removing a complaint or sms_stop entry means contacting someone who complained "
                "or said STOP; repeat the request with force=true if that is intended.",
                protected_reasons=exc.reasons,
            ) from None
        await db_session.commit()
        now = dt.datetime.now(dt.UTC)
        return SuppressionsRemoved([entry_view(suppression.protector, r, now) for r in removed])

    @post(
        "/check",
        opt={"scope": "read"},
        status_code=200,
        request_max_body_size=8 * 1024 * 1024,
        summary="Which of these addresses are suppressed (campaign pre-filter)",
        responses={
            422: ResponseSpec(
                None,
                description="Invalid category or topic "
                "(urn:problem:invalid-category, urn:problem:invalid-parameter)",
            )
        },
    )
    async def check(self, data: CheckRequest, suppression: SuppressionContext) -> CheckResult:
        """Up to 10,000 addresses in, the suppressed (and invalid) ones out, in one query.

        A hot path: no ORM session, one statement on a pooled asyncpg connection in
        autocommit (no BEGIN/COMMIT round trips).
        """
        _channel(data.channel)
        if len(data.addresses) > MAX_CHECK_ADDRESSES:
            raise _problem(
                400,
                "urn:problem:too-many-addresses",
                f"At most {MAX_CHECK_ADDRESSES} addresses per request.",
            )
        if data.category not in ("transactional", "marketing"):
            raise _problem(
                422, "urn:problem:invalid-category", "category must be transactional or marketing"
            )
        _scope_value(data.topic, "topic", 422)
        topic = data.topic or ("marketing" if data.category == "marketing" else None)
        hashes: list[tuple[str, str]] = []
        invalid: list[CheckInvalid] = []
        for raw in data.addresses:
            try:
                address = normalize(data.channel, raw, suppression.default_region, strict=True)
            except InvalidAddress as exc:
                invalid.append(CheckInvalid(raw, exc.problem))
                continue
            hashes.append((raw, suppression.protector.hash(data.channel, address.key)))
        hits: dict[str, service.Hit] = {}
        if hashes:
            async with pg_connection(suppression.engine) as conn:
                hits = await service.check_many(
                    conn,
                    data.channel,
                    [h for _, h in hashes],
                    category=data.category,
                    topic=topic,
                )
        suppressed = [
            CheckHit(raw, hit.reason, hit.scope, hit.created_at, hit.expires_at)
            for raw, h in hashes
            if (hit := hits.get(h)) is not None
        ]
        return CheckResult(suppressed, invalid)

    @post(
        "/import",
        opt={"scope": "admin"},
        status_code=200,
        # Streamed and processed in batches, so there is no reason to cap the size.
        request_max_body_size=None,
        summary="Import a CSV or JSON Lines file (ours, SES, SendGrid), streamed",
        operation_class=_operation(
            body={"text/csv": _TEXT, "application/x-ndjson": _TEXT},
            body_description="The file, read whatever the Content-Type; with format=auto "
            "its layout is recognized from the first line (400 "
            "urn:problem:unrecognized-import-format when it is none of them). An empty "
            "body imports nothing.",
            body_required=False,
        ),
    )
    async def import_entries(
        self,
        request: Request[Any, Any, Any],
        suppression: SuppressionContext,
        format: Annotated[
            str,
            Parameter(
                description="auto (sniff), gateway, ses or sendgrid",
                schema_extra={"enum": list(IMPORT_FORMATS)},
            ),
        ] = "auto",
        sendgrid_list: Annotated[str | None, _one_of(SENDGRID_LISTS)] = None,
        unsubscribe_scope: Annotated[
            str,
            Parameter(
                description="Scope given to imported unsubscribes",
                schema_extra={"pattern": service.SCOPE_PATTERN},
            ),
        ] = "marketing",
    ) -> ImportResult:
        """Add every valid row; invalid rows are reported, never fatal."""
        if format not in IMPORT_FORMATS:
            raise _problem(
                400, "urn:problem:invalid-parameter", f"format must be one of {IMPORT_FORMATS}"
            )
        if sendgrid_list is not None and sendgrid_list not in SENDGRID_LISTS:
            raise _problem(
                400,
                "urn:problem:invalid-parameter",
                f"sendgrid_list must be one of {SENDGRID_LISTS}",
            )
        try:
            options = ImportOptions(
                format, sendgrid_list, unsubscribe_scope, suppression.default_region
            )
        except ValueError as exc:
            raise _problem(400, "urn:problem:invalid-parameter", str(exc)) from None
        try:
            report = await run_import(
                suppression.sessions,
                suppression.protector,
                request.stream(),
                options,
                actor=suppression.actor_of(request),
            )
        except UnrecognizedFormat as exc:
            raise _problem(400, "urn:problem:unrecognized-import-format", str(exc)) from None
        return ImportResult(
            import_id=report.import_id,
            added=report.added,
            already_present=report.already_present,
            invalid_count=report.invalid_count,
            invalid=[InvalidRow(**row) for row in report.invalid[:MAX_REPORTED_INVALID]],
        )

    @get(
        "/export",
        opt={"scope": "export"},
        summary="Export every entry with its history, streamed (csv or jsonl)",
        response_description="CSV or JSON Lines, one entry per line",
        operation_class=_operation(ok={"text/csv": _TEXT, "application/x-ndjson": _TEXT}),
    )
    async def export(
        self,
        suppression: SuppressionContext,
        format: Annotated[
            str, Parameter(description="csv or jsonl", schema_extra={"enum": list(EXPORT_FORMATS)})
        ] = "csv",
        since: Annotated[
            dt.datetime | None, Parameter(description="Only entries created at or after")
        ] = None,
    ) -> Stream:
        """Stream the list in constant memory (batches read in short transactions)."""
        if format not in EXPORT_FORMATS:
            raise _problem(
                400, "urn:problem:invalid-parameter", f"format must be one of {EXPORT_FORMATS}"
            )
        # Litestar appends `; charset=utf-8` to text/* media types itself.
        media_type = "text/csv" if format == "csv" else "application/x-ndjson"
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        return Stream(
            export_chunks(
                suppression.sessions,
                suppression.protector,
                fmt=format,
                filters=Filters(since=_time(since, "since")),
            ),
            media_type=media_type,
            headers={
                "Content-Disposition": f'attachment; filename="suppressions-{stamp}.{format}"',
                "Cache-Control": "no-store",
            },
        )


# --- one-click unsubscribe (public: no API key, no cookies) -------------------------------------


class _InvalidLinkForPerson(HTTPException):
    """An unreadable token, asked for by a browser: answered with a page, not a document."""

    status_code = 400


def _invalid_link_page(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    return Response(
        invalid_link_page(), status_code=400, media_type=MediaType.HTML, headers=PAGE_HEADERS
    )


# Route-level: a person following a bad link gets a page; the app's handlers do the rest.
PAGE_EXCEPTION_HANDLERS: ExceptionHandlersMap = {_InvalidLinkForPerson: _invalid_link_page}


def _wants_html(request: Request[Any, Any, Any]) -> bool:
    # Browsers ask for text/html first; API clients (and `*/*`) keep problem+json.
    best = request.accept.best_match(["application/problem+json", MediaType.HTML])
    return best == MediaType.HTML


def _token(
    context: SuppressionContext, token: str, request: Request[Any, Any, Any]
) -> UnsubscribeToken:
    try:
        return read_token(context.protector, token)
    except InvalidUnsubscribeToken as exc:
        if _wants_html(request):
            raise _InvalidLinkForPerson(detail=str(exc)) from None
        raise _problem(400, "urn:problem:invalid-unsubscribe-token", str(exc)) from None


async def _one_click_value(request: Request[Any, Any, Any]) -> str | None:
    """The `List-Unsubscribe` field of the body (multipart/form-data or urlencoded)."""
    content_type = request.content_type[0]
    if content_type == "multipart/form-data":
        try:
            form = await request.form()
        except Exception:  # the multipart parser raises several types on garbage
            return None
        value = form.get(ONE_CLICK_FIELD)
        return value if isinstance(value, str) else None
    body = await request.body()
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except (UnicodeDecodeError, ValueError):
        return None
    return next((v for k, v in pairs if k == ONE_CLICK_FIELD), None)


@get(
    "/unsubscribe/{token:str}",
    tags=["unsubscribe"],
    dependencies=DEPENDENCIES,
    media_type=MediaType.HTML,
    exception_handlers=PAGE_EXCEPTION_HANDLERS,
    summary="Confirmation page (a GET never unsubscribes)",
    responses={400: ResponseSpec(None, description="urn:problem:invalid-unsubscribe-token")},
)
async def unsubscribe_page(
    token: str, request: Request[Any, Any, Any], suppression: SuppressionContext
) -> Response[str]:
    """Show what would be unsubscribed and a button that POSTs the one-click body."""
    parsed = _token(suppression, token, request)
    return Response(confirmation_page(parsed), media_type=MediaType.HTML, headers=PAGE_HEADERS)


@post(
    "/unsubscribe/{token:str}",
    tags=["unsubscribe"],
    dependencies=DEPENDENCIES,
    media_type=MediaType.HTML,
    status_code=200,
    request_max_body_size=16 * 1024,
    exception_handlers=PAGE_EXCEPTION_HANDLERS,
    summary="RFC 8058 one-click unsubscribe (body List-Unsubscribe=One-Click)",
    responses={
        400: ResponseSpec(
            None,
            description="urn:problem:invalid-unsubscribe-token, or "
            "urn:problem:one-click-body-required",
        ),
        503: ResponseSpec(
            None,
            description="Nothing could be stored; retry (Retry-After) "
            "(urn:problem:temporarily-unavailable)",
        ),
    },
    operation_class=_operation(
        body={
            "application/x-www-form-urlencoded": _ONE_CLICK_FORM,
            "multipart/form-data": _ONE_CLICK_FORM,
        }
    ),
)
async def unsubscribe_one_click(
    token: str,
    request: Request[Any, Any, Any],
    db_session: AsyncSession,
    suppression: SuppressionContext,
) -> Response[str]:
    """Suppress the token's topic for its address; repeating it changes nothing."""
    parsed = _token(suppression, token, request)
    value = await _one_click_value(request)
    if value is None or value.strip() != ONE_CLICK_VALUE:
        raise _problem(
            400,
            "urn:problem:one-click-body-required",
            f"The body must be {ONE_CLICK_FIELD}={ONE_CLICK_VALUE} "
            "(multipart/form-data or application/x-www-form-urlencoded).",
        )
    try:
        await apply_unsubscribe(
            db_session,
            suppression.protector,
            parsed,
            user_agent=request.headers.get("user-agent"),
            client_ip=request.client.host if request.client else None,
            default_region=suppression.default_region,
        )
        await db_session.commit()
    except InvalidUnsubscribeToken as exc:
        raise _problem(400, "urn:problem:invalid-unsubscribe-token", str(exc)) from None
    except (SQLAlchemyError, OSError):
        # The database is unreachable or failed: nothing was stored. A 503 (not a 500) tells
        # the mailbox provider to try again; the request came from outside and was valid.
        log.exception("one-click unsubscribe could not be stored")
        raise HTTPException(
            status_code=503,
            detail="The unsubscribe could not be recorded right now; please retry.",
            headers={"Retry-After": str(UNSUBSCRIBE_RETRY_AFTER_SECONDS)},
            extra={"type": "urn:problem:temporarily-unavailable"},
        ) from None
    return Response(done_page(parsed), media_type=MediaType.HTML, headers=PAGE_HEADERS)


ROUTES: list[Any] = [SuppressionsController, unsubscribe_page, unsubscribe_one_click]
