"""The console's pages: HTML rendered by the server (Jinja2, strict autoescaping), forms that
work without JavaScript, and the same service functions and rules as the API.

Who may do what: signing in needs a key with scope `read`; every page can be read with it.
Changes (add or remove a suppression, redrive or discard dead letters, import) need `admin`,
the export needs `export` (as in the API); a session without the scope sees no such button,
and the server refuses the request anyway (403 page). A non-admin sees only the deliveries and
messages of its own key, as `GET /v1/messages/{id}` does.
"""

from __future__ import annotations

import datetime as dt
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from litestar import MediaType, Request, Response, Router, get, post
from litestar.datastructures import Cookie, UploadFile
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.response import Redirect, Stream

from gateway.console import overview
from gateway.console.session import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_FORM_SECONDS,
    SESSION_SECONDS,
    Session,
    csrf_ok,
    csrf_token,
    decode,
    encode,
    login_token,
    new_session,
    signing_key,
)
from gateway.inputs import text_problem
from gateway.keys import Principal, lookup_principal_by_id
from gateway.metrics import counter_values
from gateway.providers import PROVIDERS as REGISTERED_PROVIDERS
from gateway.services import Services
from retry import dlq
from sender import log as dlog
from suppression import service as suppressions
from suppression.db import pg_connection, pg_of, utcnow
from suppression.exporter import export_chunks
from suppression.formats import IMPORT_FORMATS, SENDGRID_LISTS, ImportOptions, UnrecognizedFormat
from suppression.importer import MAX_REPORTED_INVALID, run_import
from suppression.listing import Filters, InvalidCursor, decode_cursor, encode_cursor, page
from suppression.normalize import CHANNELS, InvalidAddress, normalize
from suppression.views import display_address, entry_view, history_view
from webhooks.history import events_with_payloads

HERE = Path(__file__).parent
PREFIX = "/console"
MAX_TEXT = 1000
MAX_SELECTED = 500
IMPORT_MAX_BYTES = 256 * 1024 * 1024
PAGE_ROWS = 100
AGES = {"1h": dt.timedelta(hours=1), "24h": dt.timedelta(days=1), "7d": dt.timedelta(days=7)}
# The registered providers (gateway/providers.py): circuits shown, event filter choices.
PROVIDERS = tuple(r.name for r in REGISTERED_PROVIDERS)
# What a raw provider payload (or an event's details) may carry that is a hash or a secret:
# signatures, our derived key (SES tag `derived_key`, header `X-Gateway-Delivery`, Twilio's
# delivery ref) and the tokenized one-click unsubscribe URL. None of it is shown.
# An SNS envelope's UnsubscribeURL / SubscribeURL / Token are capabilities over the topic
# subscription: not shown either.
_HIDDEN_KEYS = frozenset(
    {"signature", "x-twilio-signature", "derived_key", "unsubscribeurl", "subscribeurl", "token"}
)
_HIDDEN_HEADERS = frozenset({"x-gateway-delivery", "list-unsubscribe", "list-unsubscribe-post"})
HIDDEN = "(not shown)"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "\u2013"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(value: dt.datetime | None) -> str:
    if value is None:
        return "\u2013"
    seconds = int((dt.datetime.now(dt.UTC) - value).total_seconds())
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


_ENV.filters.update(when=_when, ago=_ago, pretty=_pretty)


# --- errors as pages --------------------------------------------------------------------------


class SignInRequired(Exception):
    """No valid session (none, forged, expired, or its key was revoked)."""


class ConsoleError(Exception):
    """A refusal shown as a page: 400, 403, 404, 409, 413 or 422, with an explanation."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


@dataclass
class Viewer:
    """The signed-in operator: the key (id, name, scopes) and this session's CSRF token."""

    principal: Principal
    session: Session
    csrf: str

    @property
    def admin(self) -> bool:
        """May change things."""
        return self.principal.allows("admin")

    @property
    def can_export(self) -> bool:
        """May download the suppression list."""
        return self.principal.allows("export")

    @property
    def session_ends(self) -> dt.datetime:
        """When this session expires (8 hours after sign-in)."""
        return dt.datetime.fromtimestamp(self.session.expires_at, dt.UTC)

    @property
    def client_filter(self) -> uuid.UUID | None:
        """Whose messages this viewer may see: None for every client (admin)."""
        return None if self.admin else self.principal.key_id


def _secure(services: Services) -> bool:
    return services.settings.public_url.lower().startswith("https:")


def _key(services: Services) -> bytes:
    return signing_key(services.settings.hash_key)


def _headers() -> dict[str, str]:
    return {
        "Cache-Control": "no-store",
        "Content-Security-Policy": (
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
            "frame-ancestors 'none'; base-uri 'none'"
        ),
        "Referrer-Policy": "same-origin",
        "X-Content-Type-Options": "nosniff",
    }


def render(
    template: str,
    *,
    viewer: Viewer | None,
    status: int = 200,
    cookies: list[Cookie] | None = None,
    **context: Any,
) -> Response[str]:
    """A page of `template` with the viewer (None on the sign-in page)."""
    body = _ENV.get_template(template).render(viewer=viewer, prefix=PREFIX, **context)
    return Response(
        body,
        status_code=status,
        media_type=MediaType.HTML,
        headers=_headers(),
        cookies=cookies or [],
    )


def _session_cookie(services: Services, value: str, max_age: int) -> Cookie:
    return Cookie(
        key=COOKIE,
        value=value,
        path=PREFIX,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=_secure(services),
    )


def _sign_in_redirect(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    target = request.url.path
    if request.method == "GET" and request.url.query:
        target += "?" + request.url.query
    services: Services = request.app.state.services
    location = f"{PREFIX}/login" + (
        f"?next={quote(target, safe='')}" if request.method == "GET" else ""
    )
    return Redirect(
        location,
        status_code=303,
        headers={"Cache-Control": "no-store"},
        cookies=[_session_cookie(services, "", 0)],
    )


def _error_page(request: Request[Any, Any, Any], exc: Exception) -> Response[str]:
    viewer = getattr(request.state, "console_viewer", None)
    if isinstance(exc, ConsoleError):
        return render(
            "error.html", viewer=viewer, status=exc.status, title=exc.title, detail=exc.detail
        )
    assert isinstance(exc, HTTPException)
    status = exc.status_code if 400 <= exc.status_code < 500 else 400
    return render(
        "error.html",
        viewer=viewer,
        status=status,
        title="Request refused",
        detail=str(exc.detail),
    )


def _refuse(detail: str) -> ConsoleError:
    return ConsoleError(403, "Not allowed", detail)


# --- the session --------------------------------------------------------------------------------


async def provide_viewer(request: Request[Any, Any, Any], services: Services) -> Viewer:
    """The signed-in operator, checked on every request: a valid cookie whose key still exists,
    is not revoked and has scope `read` (one primary-key look-up)."""
    key = _key(services)
    session = decode(key, request.cookies.get(COOKIE))
    if session is None:
        raise SignInRequired
    async with pg_connection(services.engine) as pg:
        principal = await lookup_principal_by_id(pg, session.key_id)
    if principal is None or not principal.allows("read"):
        raise SignInRequired
    viewer = Viewer(principal, session, csrf_token(key, session))
    request.state.console_viewer = viewer
    return viewer


async def _form(request: Request[Any, Any, Any]) -> Mapping[str, Any]:
    try:
        return await request.form()
    except HTTPException:
        raise
    except Exception:
        raise ConsoleError(400, "Malformed form", "The form could not be read.") from None


def _field(form: Mapping[str, Any], name: str, *, required: bool = False) -> str:
    value = form.get(name)
    text = value if isinstance(value, str) else ""
    if len(text) > MAX_TEXT:
        raise ConsoleError(400, "Too long", f"{name} has at most {MAX_TEXT} characters.")
    if text_problem(text, multiline=False) is not None:
        raise ConsoleError(400, "Invalid text", f"{name} holds a control character.")
    if required and not text.strip():
        raise ConsoleError(400, "Missing field", f"{name} is required.")
    return text.strip()


def _query(request: Request[Any, Any, Any], name: str, limit: int = 320) -> str:
    value = request.query_params.get(name) or ""
    if len(value) > limit:
        raise ConsoleError(400, "Too long", f"{name} has at most {limit} characters.")
    return value.strip()


async def _changing(request: Request[Any, Any, Any], viewer: Viewer) -> Mapping[str, Any]:
    """The form of a request that changes something: it must carry this session's CSRF token,
    and the key must have scope `admin`."""
    form = await _form(request)
    token = form.get("csrf")
    if not csrf_ok(_key(request.app.state.services), viewer.session, token):
        raise ConsoleError(
            403,
            "Form expired",
            "The form did not carry this session's CSRF token; reload the page and try again.",
        )
    if not viewer.admin:
        raise _refuse("This action needs an API key with scope admin.")
    return form


def _actor(viewer: Viewer) -> str:
    return f"console:api_key:{viewer.principal.key_id}"


# --- sign in and out ----------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    if target and target.startswith(PREFIX) and not target.startswith("//") and "\\" not in target:
        return target
    return PREFIX


@get("/login", name="console-login")
async def login_page(request: Request[Any, Any, Any], services: Services) -> Response[Any]:
    """The sign-in form (an API key with scope read or higher)."""
    if decode(_key(services), request.cookies.get(COOKIE)) is not None:
        return Redirect(PREFIX, status_code=303)
    token = login_token()
    cookie = Cookie(
        key=LOGIN_COOKIE,
        value=token,
        path=PREFIX,
        max_age=LOGIN_FORM_SECONDS,
        httponly=True,
        samesite="strict",
        secure=_secure(services),
    )
    target = _safe_next(_query(request, "next", 2000))
    return render("login.html", viewer=None, token=token, next=target, cookies=[cookie])


@post("/login", name="console-login-submit", status_code=303)
async def login(request: Request[Any, Any, Any], services: Services) -> Response[Any]:
    """Check the key once; on success set the session cookie and go on."""
    form = await _form(request)
    token = form.get("csrf")
    cookie_token = request.cookies.get(LOGIN_COOKIE)
    target = _safe_next(_field(form, "next"))
    if (
        not isinstance(token, str)
        or not cookie_token
        or not hmac.compare_digest(token.encode(), cookie_token.encode())
    ):
        raise ConsoleError(
            403, "Form expired", "The sign-in form expired; open the sign-in page again."
        )
    secret = _field(form, "key")
    principal = await services.api_keys.principal(secret) if secret else None
    if principal is None or not principal.allows("read"):
        fresh = login_token()
        return render(
            "login.html",
            viewer=None,
            status=401 if principal is None else 403,
            token=fresh,
            next=target,
            error=(
                "This API key is unknown or revoked."
                if principal is None
                else "This API key lacks the read scope the console needs."
            ),
            cookies=[
                Cookie(
                    key=LOGIN_COOKIE,
                    value=fresh,
                    path=PREFIX,
                    max_age=LOGIN_FORM_SECONDS,
                    httponly=True,
                    samesite="strict",
                    secure=_secure(services),
                )
            ],
        )
    value = encode(_key(services), new_session(principal.key_id))
    return Redirect(
        target,
        status_code=303,
        cookies=[
            _session_cookie(services, value, SESSION_SECONDS),
            Cookie(key=LOGIN_COOKIE, value="", path=PREFIX, max_age=0),
        ],
    )


@post("/logout", name="console-logout", status_code=303)
async def logout(request: Request[Any, Any, Any], services: Services) -> Response[Any]:
    """End the session in this browser (the cookie is dropped)."""
    session = decode(_key(services), request.cookies.get(COOKIE))
    form = await _form(request)
    if session is not None and not csrf_ok(_key(services), session, form.get("csrf")):
        raise ConsoleError(403, "Form expired", "Reload the page and sign out again.")
    return Redirect(f"{PREFIX}/login", status_code=303, cookies=[_session_cookie(services, "", 0)])


# --- overview -----------------------------------------------------------------------------------


@get("/", name="console-overview")
async def overview_page(viewer: Viewer, services: Services) -> Response[str]:
    """Sends by final status, rates against review levels, deferrals, circuits, DLQ, retries."""
    now = utcnow()
    async with pg_connection(services.engine) as pg:
        counts = await dlog.status_counts(
            pg, short_since=now - dt.timedelta(days=1), long_since=now - dt.timedelta(days=7)
        )
        deferrals = await dlog.deferral_counts(
            pg, short_since=now - dt.timedelta(days=1), long_since=now - dt.timedelta(days=7)
        )
        daily = await dlog.daily_status_counts(
            pg,
            since=dt.datetime.combine(now.date() - dt.timedelta(days=6), dt.time(), tzinfo=dt.UTC),
        )
        due = await dlog.oldest_due(pg, now=now)
    async with services.sessions() as session:
        depth = await dlq.open_depth(session)
    circuits = {p: await services.breaker.state(p) for p in PROVIDERS}
    failures = sorted(
        (key, int(n)) for key, n in counter_values("gateway_webhook_verification_failures").items()
    )
    return render(
        "overview.html",
        viewer=viewer,
        windows=overview.windows(counts, deferrals),
        statuses=overview.STATUS_ORDER,
        charts=overview.daily_charts(daily, now.date()),
        legend=overview.LEGEND,
        circuits=circuits,
        depth=depth,
        due=due,
        failures=failures,
        channels=overview.CHANNELS,
        now=now,
    )


# --- address ------------------------------------------------------------------------------------


_NOTICES = {
    "added": "The suppression was added.",
    "existing": "An active entry for this scope existed already; it was kept.",
    "removed": "The suppression was removed.",
}


async def _address_page(
    viewer: Viewer,
    services: Services,
    channel: str,
    raw: str,
    *,
    status: int = 200,
    notice: str | None = None,
    error: str | None = None,
    protected: list[str] | None = None,
    removal_reason: str = "",
) -> Response[str]:
    context: dict[str, Any] = {
        "channel": channel,
        "raw": raw,
        "channels": CHANNELS,
        "reasons": suppressions.REASONS,
        "notice": notice,
        "error": error,
        "protected": protected or [],
        "removal_reason": removal_reason,
        "address": None,
    }
    if not raw:
        return render("address.html", viewer=viewer, status=status, **context)
    if channel not in CHANNELS:
        raise ConsoleError(400, "Unknown channel", "The channel is email or sms.")
    try:
        address = normalize(channel, raw, services.settings.default_region)
    except InvalidAddress as exc:
        context["error"] = f"Not a valid {channel} address: {exc.problem}."
        return render("address.html", viewer=viewer, status=422, **context)
    address_hash = services.protector.hash(channel, address.key)
    async with services.sessions() as session:
        entries = await suppressions.entries_for(session, channel, address_hash)
        history = await suppressions.history_for(session, channel, address_hash)
        deliveries = await dlog.recent_for_recipient(
            await pg_of(session),
            channel,
            address_hash,
            limit=PAGE_ROWS,
            client_id=viewer.client_filter,
        )
    now = utcnow()
    views = [entry_view(services.protector, e, now) for e in entries]
    context.update(
        address=address.key,
        entries=views,
        suppressed=any(v.active for v in views),
        history=[history_view(h) for h in history],
        deliveries=deliveries,
    )
    return render("address.html", viewer=viewer, status=status, **context)


@get("/address", name="console-address")
async def address_page(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[str]:
    """Look up an email address or phone number: suppression entries, history, deliveries."""
    done = _query(request, "done", 16)
    return await _address_page(
        viewer,
        services,
        _query(request, "channel", 8) or "email",
        _query(request, "address"),
        notice=_NOTICES.get(done),
    )


def _address_url(channel: str, address: str, done: str) -> str:
    return f"{PREFIX}/address?" + urlencode({"channel": channel, "address": address, "done": done})


@post("/address/suppress", name="console-suppress", status_code=303)
async def suppress(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[Any]:
    """Add a suppression by hand (admin): a reason and a scope, as `POST /v1/suppressions`."""
    form = await _changing(request, viewer)
    channel = _field(form, "channel", required=True)
    raw = _field(form, "address", required=True)
    reason = _field(form, "reason", required=True)
    scope = _field(form, "scope") or suppressions.SCOPE_ALL
    expires_text = _field(form, "expires_at")
    if channel not in CHANNELS:
        raise ConsoleError(400, "Unknown channel", "The channel is email or sms.")
    expires_at = None
    if expires_text:
        try:
            expires_at = dlq.utc_time(dt.datetime.fromisoformat(expires_text))
        except ValueError:
            return await _address_page(
                viewer, services, channel, raw, status=422, error="The expiry is not a time."
            )
        if expires_at <= utcnow():
            return await _address_page(
                viewer, services, channel, raw, status=422, error="The expiry is in the past."
            )
    try:
        address = normalize(channel, raw, services.settings.default_region, strict=True)
    except InvalidAddress as exc:
        return await _address_page(
            viewer, services, channel, raw, status=422, error=f"Not valid: {exc.problem}."
        )
    try:
        suppressions.validate_entry(channel, reason, scope)
    except ValueError as exc:
        return await _address_page(viewer, services, channel, raw, status=422, error=str(exc))
    actor = _actor(viewer)
    async with services.sessions() as session:
        _, created = await suppressions.add(
            session,
            services.protector,
            address,
            reason=reason,
            scope=scope,
            expires_at=expires_at,
            source=suppressions.Source("operator", actor, actor=actor),
        )
        await session.commit()
    return Redirect(
        _address_url(channel, address.key, "added" if created else "existing"), status_code=303
    )


@post("/address/unsuppress", name="console-unsuppress", status_code=303)
async def unsuppress(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[Any]:
    """Remove suppressions (admin, reason required); a complaint or STOP needs `force`, as
    `DELETE /v1/suppressions/{channel}/{address}?force=true`."""
    form = await _changing(request, viewer)
    channel = _field(form, "channel", required=True)
    raw = _field(form, "address", required=True)
    reason = _field(form, "reason")
    scope = _field(form, "scope") or None
    force = form.get("force") == "yes"
    if channel not in CHANNELS:
        raise ConsoleError(400, "Unknown channel", "The channel is email or sms.")
    if not reason:
        return await _address_page(
            viewer, services, channel, raw, status=400, error="A reason is required to remove."
        )
    try:
        address = normalize(channel, raw, services.settings.default_region)
    except InvalidAddress as exc:
        return await _address_page(
            viewer, services, channel, raw, status=422, error=f"Not valid: {exc.problem}."
        )
    address_hash = services.protector.hash(channel, address.key)
    async with services.sessions() as session:
        try:
            await suppressions.remove_by_operator(
                session,
                channel,
                address_hash,
                reason=reason,
                actor=_actor(viewer),
                scope=scope,
                force=force,
                address=address,
            )
        except suppressions.NothingToRemove:
            return await _address_page(
                viewer, services, channel, raw, status=404, error="No entry matches."
            )
        except suppressions.ProtectedSuppression as exc:
            return await _address_page(
                viewer,
                services,
                channel,
                raw,
                status=409,
                error=(
                    "Removing a complaint or STOP entry means contacting someone who complained "
                    "or said STOP. Tick the confirmation and remove again if that is intended."
                ),
                protected=exc.reasons,
                removal_reason=reason,
            )
        await session.commit()
    return Redirect(_address_url(channel, address.key, "removed"), status_code=303)


# --- message ------------------------------------------------------------------------------------


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ConsoleError(404, f"No such {what}", f"{value[:64]!r} is not a {what} id.") from None


def shown(value: Any, secrets: frozenset[str]) -> Any:
    """`value` (a payload or details) without signatures, derived keys (any string in
    `secrets`) or unsubscribe tokens."""
    if isinstance(value, dict):
        name = str(value.get("name", "")).lower()
        out = {}
        for k, v in value.items():
            hidden = str(k).lower() in _HIDDEN_KEYS or (k == "value" and name in _HIDDEN_HEADERS)
            out[k] = HIDDEN if hidden else shown(v, secrets)
        return out
    if isinstance(value, list):
        return [shown(v, secrets) for v in value]
    if isinstance(value, str) and any(secret in value for secret in secrets):
        return HIDDEN
    return value


@get("/messages", name="console-message-lookup")
async def message_lookup(request: Request[Any, Any, Any], viewer: Viewer) -> Response[Any]:
    """The message look-up form; with `id`, go to that message."""
    value = _query(request, "id", 64)
    if value:
        return Redirect(f"{PREFIX}/messages/{_uuid(value, 'message')}", status_code=303)
    return render("message_lookup.html", viewer=viewer)


@get("/messages/{message_id:str}", name="console-message")
async def message_page(message_id: str, viewer: Viewer, services: Services) -> Response[str]:
    """A message's timeline: request, deliveries, attempts, provider events, retries, DLQ."""
    ident = _uuid(message_id, "message")
    async with services.sessions() as session:
        pg = await pg_of(session)
        message = await dlog.message(pg, ident)
        if message is None or (
            viewer.client_filter is not None and message.client_id != viewer.client_filter
        ):
            raise ConsoleError(404, "No such message", f"No message {ident} that you may see.")
        deliveries = await dlog.deliveries_of(pg, ident)
        ids = [d.id for d in deliveries]
        attempts = await dlog.attempts_of(pg, ids)
        events = await events_with_payloads(pg, services.protector, ids)
        dead = await dlq.entries_for_deliveries(session, ids)
    timeline: list[dict[str, Any]] = [
        {"at": message.created_at, "kind": "request", "item": message, "delivery": None}
    ]
    for a in attempts:
        timeline.append(
            {"at": a.started_at, "kind": "attempt", "item": a, "delivery": a.delivery_id}
        )
    keys = frozenset(d.derived_key for d in deliveries)
    for e in events:
        e["payload"] = shown(e["payload"], keys)
        e["details"] = shown(e["details"], keys)
        timeline.append(
            {"at": e["received_at"], "kind": "event", "item": e, "delivery": e["delivery_id"]}
        )
    for entry in dead:
        timeline.append(
            {"at": entry.created_at, "kind": "dead", "item": entry, "delivery": entry.delivery_id}
        )
        if entry.resolved_at is not None:
            timeline.append(
                {
                    "at": entry.resolved_at,
                    "kind": "resolved",
                    "item": entry,
                    "delivery": entry.delivery_id,
                }
            )
    for d in deliveries:
        if d.next_attempt_at is not None:
            timeline.append({"at": d.next_attempt_at, "kind": "retry", "item": d, "delivery": d.id})
    timeline.sort(key=lambda t: t["at"])
    labels = {d.id: f"#{d.position + 1} {d.channel}" for d in deliveries}
    metadata = message.metadata
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    return render(
        "message.html",
        viewer=viewer,
        message=message,
        metadata=metadata,
        deliveries=deliveries,
        recipients={
            d.id: display_address(services.protector, d.recipient_encrypted) for d in deliveries
        },
        timeline=timeline,
        labels=labels,
    )


# --- dead letters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DlqFilters:
    """The list's filters as given (for the form and the links)."""

    channel: str
    reason: str
    provider: str
    age: str
    state: str

    def query(self) -> str:
        """The filters as a query string."""
        return urlencode({k: v for k, v in vars(self).items() if v})


def _dlq_filters(request: Request[Any, Any, Any]) -> DlqFilters:
    f = DlqFilters(
        channel=_query(request, "channel", 16),
        reason=_query(request, "reason", 64),
        provider=_query(request, "provider", 16),
        age=_query(request, "age", 8),
        state=_query(request, "state", 16) or "open",
    )
    if f.channel and f.channel not in CHANNELS:
        raise ConsoleError(400, "Unknown channel", "The channel is email or sms.")
    if f.provider and f.provider not in PROVIDERS:
        raise ConsoleError(400, "Unknown provider", f"The provider is one of {PROVIDERS}.")
    if f.age and f.age not in AGES:
        raise ConsoleError(400, "Unknown age", f"The age is one of {tuple(AGES)}.")
    if f.state not in dlq.STATES:
        raise ConsoleError(400, "Unknown state", f"The state is one of {dlq.STATES}.")
    return f


@get("/dlq", name="console-dlq")
async def dlq_page(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[str]:
    """Dead letters, newest first, filtered by channel, reason, provider and age."""
    f = _dlq_filters(request)
    until = utcnow() - AGES[f.age] if f.age else None
    async with services.sessions() as session:
        entries = await dlq.list_for_console(
            session,
            services.delivery_queue,
            dlq.DeadLetterFilter(f.reason or None, f.channel or None, None, until, f.state),
            provider=f.provider or None,
            limit=PAGE_ROWS,
        )
    return render(
        "dlq.html",
        viewer=viewer,
        entries=entries,
        filters=f,
        channels=CHANNELS,
        reasons=dlq.REASONS,
        providers=PROVIDERS,
        ages=AGES,
        states=dlq.STATES,
        limit=PAGE_ROWS,
        select_all=_query(request, "select", 8) == "all",
    )


@get("/dlq/{entry_id:str}", name="console-dlq-entry")
async def dlq_entry_page(entry_id: str, viewer: Viewer, services: Services) -> Response[str]:
    """One dead letter with its attempt history and a link to its message."""
    ident = _uuid(entry_id, "dead-letter entry")
    async with services.sessions() as session:
        try:
            entry = await dlq.get_entry(session, services.delivery_queue, ident)
        except dlq.DeadLetterNotFound:
            raise ConsoleError(404, "No such entry", f"No dead-letter entry {ident}.") from None
        found = await dlog.for_dispatch(await pg_of(session), entry.row.delivery_id)
    message_id = found[0].message_id if found is not None else None
    return render("dlq_entry.html", viewer=viewer, entry=entry, message_id=message_id)


@post("/dlq/action", name="console-dlq-action")
async def dlq_action(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[Any]:
    """Redrive or discard the selected entries (admin). Without `confirmed` this answers a
    confirmation page that says how many; with it, each entry goes through the same service
    function and rules as `POST /v1/dlq/{id}/redrive` and `DELETE /v1/dlq/{id}`."""
    form = await _changing(request, viewer)
    action = _field(form, "action", required=True)
    if action not in ("redrive", "discard"):
        raise ConsoleError(400, "Unknown action", "The action is redrive or discard.")
    getall = getattr(form, "getall", None)
    raw_ids = getall("ids") if getall is not None else []
    if not raw_ids:
        raise ConsoleError(400, "Nothing selected", "Select at least one entry.")
    if len(raw_ids) > MAX_SELECTED:
        raise ConsoleError(400, "Too many", f"At most {MAX_SELECTED} entries at once.")
    ids = list(dict.fromkeys(_uuid(str(v), "dead-letter entry") for v in raw_ids))
    reason = _field(form, "reason")
    back = _safe_next(_field(form, "back"))
    if form.get("confirmed") != "yes" or (action == "discard" and not reason):
        return render(
            "dlq_confirm.html",
            viewer=viewer,
            action=action,
            ids=ids,
            reason=reason,
            back=back,
            error=(
                "A reason is required to discard."
                if action == "discard" and form.get("confirmed") == "yes"
                else None
            ),
            status=400 if form.get("confirmed") == "yes" else 200,
        )
    done = 0
    refused: list[tuple[uuid.UUID, str]] = []
    for ident in ids:
        async with services.sessions() as session:
            try:
                if action == "redrive":
                    await dlq.redrive(
                        session,
                        services.delivery_queue,
                        ident,
                        actor=_actor(viewer),
                        note=reason or None,
                    )
                else:
                    await dlq.discard(
                        session, services.delivery_queue, ident, actor=_actor(viewer), reason=reason
                    )
            except (dlq.DeadLetterNotFound, dlq.DeadLetterConflict) as exc:
                await session.rollback()
                refused.append((ident, str(exc)))
                continue
            await session.commit()
            done += 1
    return render(
        "dlq_result.html",
        viewer=viewer,
        action=action,
        done=done,
        refused=refused,
        back=back,
        status=200 if not refused else 409,
    )


# --- suppressions -------------------------------------------------------------------------------


@get("/suppressions", name="console-suppressions")
async def suppressions_page(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[str]:
    """The list, filtered by channel, reason and scope, a page at a time (oldest first)."""
    channel = _query(request, "channel", 8)
    reason = _query(request, "reason", 32)
    scope = _query(request, "scope", 128)
    cursor = _query(request, "cursor", 512)
    if channel and channel not in CHANNELS:
        raise ConsoleError(400, "Unknown channel", "The channel is email or sms.")
    if reason and reason not in suppressions.REASONS:
        raise ConsoleError(400, "Unknown reason", "Choose a reason from the list.")
    after = None
    if cursor:
        try:
            after = decode_cursor(cursor)
        except InvalidCursor:
            raise ConsoleError(400, "Bad cursor", "This page link is not valid.") from None
    async with services.sessions() as session:
        rows, last = await page(
            session,
            Filters(channel or None, reason or None, scope or None),
            after=after,
            limit=PAGE_ROWS,
        )
    now = utcnow()
    query = {"channel": channel, "reason": reason, "scope": scope}
    next_url = None
    if last is not None:
        next_url = f"{PREFIX}/suppressions?" + urlencode(
            {**{k: v for k, v in query.items() if v}, "cursor": encode_cursor(*last)}
        )
    return render(
        "suppressions.html",
        viewer=viewer,
        entries=[entry_view(services.protector, r, now) for r in rows],
        channels=CHANNELS,
        reasons=suppressions.REASONS,
        filters=query,
        next_url=next_url,
        formats=IMPORT_FORMATS,
        sendgrid_lists=SENDGRID_LISTS,
    )


@get("/suppressions/export", name="console-export")
async def export(request: Request[Any, Any, Any], viewer: Viewer, services: Services) -> Stream:
    """The suppression list as CSV, streamed: the same bytes as `GET /v1/suppressions/export`
    (scope export)."""
    if not viewer.can_export:
        raise _refuse("The export needs an API key with scope export.")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return Stream(
        export_chunks(services.sessions, services.protector, fmt="csv", filters=Filters()),
        media_type="text/csv",
        headers={
            "Content-Disposition": f'attachment; filename="suppressions-{stamp}.csv"',
            "Cache-Control": "no-store",
        },
    )


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(64 * 1024):
        yield chunk


@post(
    "/suppressions/import",
    name="console-import",
    request_max_body_size=IMPORT_MAX_BYTES,
    status_code=200,
)
async def import_file(
    request: Request[Any, Any, Any], viewer: Viewer, services: Services
) -> Response[str]:
    """Import an uploaded file (admin), as `POST /v1/suppressions/import`, and show the report."""
    form = await _changing(request, viewer)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ConsoleError(400, "No file", "Choose a file to import.")
    fmt = _field(form, "format") or "auto"
    sendgrid_list = _field(form, "sendgrid_list") or None
    unsubscribe_scope = _field(form, "unsubscribe_scope") or "marketing"
    try:
        options = ImportOptions(
            fmt, sendgrid_list, unsubscribe_scope, services.settings.default_region
        )
    except ValueError as exc:
        raise ConsoleError(400, "Invalid options", str(exc)) from None
    try:
        report = await run_import(
            services.sessions,
            services.protector,
            _chunks(upload),
            options,
            actor=_actor(viewer),
        )
    except UnrecognizedFormat as exc:
        raise ConsoleError(400, "Unrecognized file", str(exc)) from None
    finally:
        await upload.close()
    return render(
        "import_report.html",
        viewer=viewer,
        report=report,
        invalid=report.invalid[:MAX_REPORTED_INVALID],
        filename=upload.filename,
    )


# --- static -------------------------------------------------------------------------------------

_CSS = (HERE / "static" / "console.css").read_bytes()


@get("/static/console.css", name="console-css", cache=3600)
async def stylesheet() -> Response[bytes]:
    """The console's stylesheet (served from the package: nothing is fetched elsewhere)."""
    return Response(_CSS, media_type="text/css", headers={"X-Content-Type-Options": "nosniff"})


def console_router() -> Router:
    """Every console route under `/console`, kept out of the OpenAPI document (HTML pages, not
    API: the contract test covers documented API routes)."""
    return Router(
        path=PREFIX,
        route_handlers=[
            login_page,
            login,
            logout,
            overview_page,
            address_page,
            suppress,
            unsuppress,
            message_lookup,
            message_page,
            dlq_page,
            dlq_entry_page,
            dlq_action,
            suppressions_page,
            export,
            import_file,
            stylesheet,
        ],
        dependencies={"viewer": Provide(provide_viewer)},
        exception_handlers={
            SignInRequired: _sign_in_redirect,
            ConsoleError: _error_page,
            HTTPException: _error_page,
        },
        include_in_schema=False,
    )
