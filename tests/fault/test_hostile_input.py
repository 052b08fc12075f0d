"""Drill: every text input of every route with NUL, C0 controls, lone surrogates and 1 MB
strings gets a 4xx problem document and stores nothing (issue 11, defects 3 and 4; issue 12's
leniency). Row counts of every table (and the open dead-letter entries) are compared before
and after each request."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest
from litestar import Litestar
from sqlalchemy import func, select

from gateway.models import ApiKey
from gateway.services import Services
from retry.models import DeadLetter
from sender import log as dlog
from sender.models import Attempt, Delivery, Message
from suppression.db import pg_of, utcnow
from suppression.models import Suppression, SuppressionHistory
from suppression.tokens import issue_token
from tests.conftest import bearer
from tests.retry.helpers import insert_deliveries
from webhooks.models import ProviderEvent

MB = 1024 * 1024
SURROGATE = "\ud800"

# Hostile values for a single-line text field, by name (the 1 MB one is added per input).
SINGLE_LINE = {
    "nul": "a\x00b",
    "soh": "a\x01b",
    "escape": "a\x1bb",
    "unit separator": "a\x1fb",
    "crlf": "a\r\nBcc: victim@example.com",
    "lf": "a\nb",
    "tab": "a\tb",
    "lone surrogate": f"a{SURROGATE}b",
    "low surrogate": "a\udfffb",
}
# In a multi-line body field tab and line breaks are fine; these are not.
MULTI_LINE = {k: v for k, v in SINGLE_LINE.items() if k not in ("crlf", "lf", "tab")}

_TABLES = (ApiKey, Message, Delivery, Attempt, Suppression, SuppressionHistory, ProviderEvent)


async def snapshot(services: Services) -> dict[str, int]:
    """Row counts of every table the API writes, and how many dead-letter entries are open."""
    counts: dict[str, int] = {}
    async with services.sessions() as s:
        for model in _TABLES:
            counts[model.__tablename__] = int(
                await s.scalar(select(func.count()).select_from(model)) or 0
            )
        counts["dead_letters"] = int(await s.scalar(select(func.count(DeadLetter.id))) or 0)
        counts["dead_letters_open"] = int(
            await s.scalar(
                select(func.count(DeadLetter.id)).where(DeadLetter.resolved_at.is_(None))
            )
            or 0
        )
    return counts


async def raw_asgi(
    app: Litestar, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]]
) -> httpx.Response:
    """One request straight to the app, for what httpx refuses to build (a URL over 64 KB)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw_path = path.encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "https",
        "path": unquote(path),
        "raw_path": raw_path,
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"gateway.test"), *headers],
        "client": ("203.0.113.7", 4711),
        "server": ("gateway.test", 443),
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return httpx.Response(start["status"], headers=start["headers"], content=body)


@dataclass
class Rig:
    app: Litestar
    services: Services
    client: httpx.AsyncClient
    admin: dict[str, str]
    entry: uuid.UUID
    token: str
    baseline: dict[str, int] = field(default_factory=dict)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: str = "",
        headers: dict[str, str] | None = None,
        raw_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> httpx.Response:
        """Send exactly what is given: the body as ASCII JSON (a lone surrogate travels as
        its `\\ud800` escape), the query already encoded."""
        all_headers = {**self.admin, "Idempotency-Key": '"hostile-1"', **(headers or {})}
        content = None
        if body is not None:
            content = json.dumps(body).encode("ascii")
            all_headers["Content-Type"] = "application/json"
        url = path + (f"?{query}" if query else "")
        header_list = [(k.encode(), v.encode()) for k, v in all_headers.items()]
        header_list += raw_headers or []
        if len(url) > 60_000:
            path, _, query = url.partition("?")
            return await raw_asgi(self.app, method, path, query.encode(), header_list)
        return await self.client.request(method, url, content=content, headers=header_list)

    async def refused(self, response: httpx.Response, what: str) -> None:
        """A 4xx problem document, and no table changed."""
        assert 400 <= response.status_code < 500, (what, response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/problem+json"), what
        assert await snapshot(self.services) == self.baseline, what


async def _dead_letter(services: Services) -> uuid.UUID:
    async with services.sessions() as s, s.begin():
        (delivery_id,) = await insert_deliveries(s, 1, channel="sms", attempts_made=1)
        return await dlog.dead_letter(
            await pg_of(s), delivery_id, reason="max_attempts", last_error="x", now=utcnow()
        )


@pytest.fixture
async def rig(
    app: Litestar,
    services: Services,
    client: httpx.AsyncClient,
    make_key: Callable[..., Awaitable[str]],
) -> Rig:
    admin = bearer(await make_key("admin"))
    entry = await _dead_letter(services)
    token = issue_token(
        services.protector,
        channel="email",
        address="reader@example.com",
        topic="marketing",
        delivery_id=uuid.uuid4(),
    )
    rig = Rig(app, services, client, admin, entry, token)
    rig.baseline = await snapshot(services)
    return rig


# --- issue 11, defect 3: each case used to be a 500 ----------------------------------------


async def test_defect_3_cases_are_refused_and_store_nothing(rig: Rig) -> None:
    email = {"channel": "email", "to": ["a@example.com"], "subject": "s", "text": "t"}
    nul_metadata = {**email, "metadata": {"k": "v\x00"}}
    for attempt in ("first", "retry with the same key"):
        response = await rig.request("POST", "/v1/messages", body=nul_metadata)
        assert response.status_code == 422, (attempt, response.text)
        assert response.json()["type"] == "urn:problem:invalid-text"
        assert response.json()["errors"] == [
            {"field": "metadata.k", "problem": "contains a NUL character"}
        ]
        await rig.refused(response, attempt)
    response = await rig.request("POST", "/v1/keys", body={"name": "a\x00b", "scopes": ["read"]})
    assert response.status_code == 422
    await rig.refused(response, "key name")
    for name in ("reason", "channel"):
        response = await rig.request("GET", "/v1/dlq", query=f"{name}=%00")
        assert response.status_code == 400, response.text
        assert response.json()["errors"][0]["parameter"] == name
        await rig.refused(response, name)
    response = await rig.request("POST", "/v1/dlq/redrive", body={"reason": "\x00"})
    assert response.status_code == 422
    await rig.refused(response, "bulk redrive reason")
    response = await rig.request("DELETE", f"/v1/dlq/{rig.entry}", query="reason=a%00b")
    assert response.status_code == 400
    await rig.refused(response, "discard reason")
    response = await rig.request("POST", f"/v1/dlq/{rig.entry}/redrive", body={"note": "x\x00y"})
    assert response.status_code == 422
    await rig.refused(response, "redrive note")


# --- issue 11, defect 4: header injection and unbounded text ------------------------------


_EMAIL = {"channel": "email", "to": ["a@example.com"], "subject": "s", "text": "t"}

_INJECTIONS = [
    ("subject", {**_EMAIL, "subject": "Hi\r\nBcc: victim@example.com"}),
    ("subject", {**_EMAIL, "subject": "Hi\nX-Evil: 1"}),
    ("subject", {**_EMAIL, "subject": "Hi\x00there"}),
    ("from", {**_EMAIL, "from": "Eve\r\nBcc: v@example.com <eve@example.com>"}),
    ("reply_to[0]", {**_EMAIL, "reply_to": ["a@example.com\r\nBcc: v@example.com"]}),
    ("reply_to", {**_EMAIL, "reply_to": "a@example.com\nBcc: v@example.com"}),
    ("topic", {**_EMAIL, "category": "marketing", "topic": "news\r\nX: 1"}),
    ("metadata.tag", {**_EMAIL, "metadata": {"tag": "a\nb"}}),
    ("metadata.a\nb", {**_EMAIL, "metadata": {"a\nb": "v"}}),
]


@pytest.mark.parametrize(("field_name", "body"), _INJECTIONS, ids=[f for f, _ in _INJECTIONS])
async def test_line_breaks_in_header_fields_are_422(
    rig: Rig, field_name: str, body: dict[str, Any]
) -> None:
    response = await rig.request("POST", "/v1/messages", body=body)
    assert response.status_code == 422, response.text
    assert field_name in [e["field"] for e in response.json()["errors"]]
    await rig.refused(response, field_name)


async def test_multi_line_body_text_keeps_its_line_breaks(rig: Rig) -> None:
    body = {**_EMAIL, "text": "Line one\r\nLine two\n\tindented", "html": "<p>a</p>\n<p>b</p>"}
    response = await rig.request("POST", "/v1/messages", body=body)
    assert response.status_code in (201, 202), response.text
    sms = {"channel": "sms", "to": ["+15005550006"], "body": "Code:\n123456"}
    response = await rig.request(
        "POST", "/v1/messages", body=sms, headers={"Idempotency-Key": '"hostile-2"'}
    )
    assert response.status_code in (201, 202), response.text


async def test_a_100_kb_key_name_is_refused(rig: Rig) -> None:
    response = await rig.request("POST", "/v1/keys", body={"name": "k" * 100_000, "scopes": []})
    assert response.status_code == 400, response.text
    await rig.refused(response, "key name")
    ok = await rig.request("POST", "/v1/keys", body={"name": "k" * 200, "scopes": ["read"]})
    assert ok.status_code == 201, ok.text


# --- the drill: every text input of every route -------------------------------------------

# (route, field) -> the valid body the hostile value is put into; `[0]` means a list item,
# `.key`/`.value` a metadata entry.
_BODY_INPUTS: list[tuple[str, str, str, dict[str, Any], bool]] = [
    # method, path, field, base body, multi-line
    *[
        ("POST", "/v1/messages", f, _EMAIL, f in ("text", "html"))
        for f in ("to[0]", "from", "subject", "text", "html", "reply_to[0]", "topic")
    ],
    ("POST", "/v1/messages", "body", {"channel": "sms", "to": ["+15005550006"]}, True),
    ("POST", "/v1/messages", "to[0]", {"channel": "sms", "to": [], "body": "b"}, False),
    ("POST", "/v1/messages", "metadata.key", _EMAIL, False),
    ("POST", "/v1/messages", "metadata.value", _EMAIL, False),
    ("POST", "/v1/messages", "channel", _EMAIL, False),
    ("POST", "/v1/messages", "category", _EMAIL, False),
    ("POST", "/v1/messages", "priority", _EMAIL, False),
    ("POST", "/v1/messages", "expires_at", _EMAIL, False),
    ("POST", "/v1/keys", "name", {"scopes": ["read"]}, False),
    ("POST", "/v1/keys", "scopes[0]", {"scopes": []}, False),
    *[
        (
            "POST",
            "/v1/suppressions",
            f,
            {"channel": "email", "address": "s@example.com", "reason": "manual"},
            False,
        )
        for f in ("channel", "address", "reason", "scope", "expires_at")
    ],
    *[
        ("POST", "/v1/suppressions/check", f, {"channel": "email", "addresses": []}, False)
        for f in ("channel", "addresses[0]", "category", "topic")
    ],
    *[
        ("POST", "/v1/dlq/redrive", f, {}, False)
        for f in ("reason", "channel", "since", "until", "note")
    ],
    ("POST", "/v1/dlq/{entry}/redrive", "note", {}, False),
]


def _with(base: dict[str, Any], field_name: str, value: str) -> dict[str, Any]:
    body = json.loads(json.dumps(base))
    if field_name == "metadata.key":
        body["metadata"] = {value: "v"}
    elif field_name == "metadata.value":
        body["metadata"] = {"k": value}
    elif field_name.endswith("[0]"):
        body[field_name[:-3]] = [value]
    else:
        body[field_name] = value
    return body


def _values(multiline: bool) -> dict[str, str]:
    return {**(MULTI_LINE if multiline else SINGLE_LINE), "1 MB": "x" * MB}


@pytest.mark.parametrize(
    ("method", "path", "field_name", "base", "multiline"),
    _BODY_INPUTS,
    ids=[f"{m} {p} {f}" for m, p, f, _, _ in _BODY_INPUTS],
)
async def test_hostile_json_fields(
    rig: Rig, method: str, path: str, field_name: str, base: dict[str, Any], multiline: bool
) -> None:
    for kind, value in _values(multiline).items():
        body = _with(base, field_name, value)
        response = await rig.request(method, path.format(entry=rig.entry), body=body)
        await rig.refused(response, f"{field_name} {kind}")


# (method, path, parameter) of every query parameter that takes text.
_QUERY_INPUTS = [
    *[
        ("GET", "/v1/dlq", p)
        for p in ("reason", "channel", "cursor", "state", "since", "until", "limit")
    ],
    ("DELETE", "/v1/dlq/{entry}", "reason"),
    *[
        ("GET", "/v1/suppressions", p)
        for p in ("channel", "reason", "scope", "cursor", "since", "limit")
    ],
    *[("DELETE", "/v1/suppressions/email/s@example.com", p) for p in ("reason", "scope", "force")],
    *[("GET", "/v1/suppressions/export", p) for p in ("format", "since")],
    *[
        ("POST", "/v1/suppressions/import", p)
        for p in ("format", "sendgrid_list", "unsubscribe_scope")
    ],
    ("POST", "/webhooks/twilio/status", "d"),
]


def _encoded_values() -> dict[str, str]:
    values = {k: quote(v, safe="", errors="surrogatepass") for k, v in SINGLE_LINE.items()}
    values["lone surrogate"] = "a%ED%A0%80b"  # a surrogate's bytes: not UTF-8
    values["1 MB"] = "x" * MB
    return values


@pytest.mark.parametrize(
    ("method", "path", "name"), _QUERY_INPUTS, ids=[f"{m} {p} {n}" for m, p, n in _QUERY_INPUTS]
)
async def test_hostile_query_parameters(rig: Rig, method: str, path: str, name: str) -> None:
    for kind, value in _encoded_values().items():
        query = f"{name}={value}"
        # Routes that require a reason get a good one, so that the hostile one is the only fault.
        if name != "reason" and method == "DELETE":
            query += "&reason=cleanup"
        response = await rig.request(method, path.format(entry=rig.entry), query=query)
        await rig.refused(response, f"{name} {kind}")


# Every path parameter that takes text.
_PATH_INPUTS = [
    ("GET", "/v1/suppressions/email/{}"),
    ("DELETE", "/v1/suppressions/email/{}?reason=x"),
    ("GET", "/v1/suppressions/{}/a@example.com"),
    ("GET", "/v1/subjects/email/{}"),
    ("DELETE", "/v1/subjects/sms/{}"),
    ("GET", "/v1/subjects/{}/a@example.com"),
    ("GET", "/unsubscribe/{}"),
    ("POST", "/unsubscribe/{}"),
]


@pytest.mark.parametrize(
    ("method", "template"), _PATH_INPUTS, ids=[f"{m} {t}" for m, t in _PATH_INPUTS]
)
async def test_hostile_path_parameters(rig: Rig, method: str, template: str) -> None:
    for kind, value in _encoded_values().items():
        path, _, query = template.format(value).partition("?")
        if len(path) > 60_000:
            response = await raw_asgi(
                rig.app,
                method,
                path,
                query.encode(),
                [(k.lower().encode(), v.encode()) for k, v in rig.admin.items()],
            )
        else:
            response = await rig.client.request(
                method,
                template.format(value),
                headers=rig.admin,
                content=b"List-Unsubscribe=One-Click" if method == "POST" else None,
            )
        await rig.refused(response, f"{template} {kind}")


_HEADER_VALUES = {
    "nul": b"a\x00b",
    "soh": b"a\x01b",
    "cr": b"a\rb",
    "lf": b"a\nb",
    "del": b"a\x7fb",
    "1 MB": b"x" * MB,
}


@pytest.mark.parametrize("kind", _HEADER_VALUES)
async def test_hostile_headers(rig: Rig, kind: str) -> None:
    value = _HEADER_VALUES[kind]
    body = {**_EMAIL}
    for name in (b"Idempotency-Key", b"User-Agent", b"X-Anything"):
        headers = [(k.encode(), v.encode()) for k, v in rig.admin.items()]
        headers += [(b"Content-Type", b"application/json"), (name, value)]
        if name != b"Idempotency-Key":
            headers.append((b"Idempotency-Key", b'"hostile-h"'))
        response = await rig.client.post(
            "/v1/messages", content=json.dumps(body).encode(), headers=headers
        )
        await rig.refused(response, f"{name!r} {kind}")
    # The one-click unsubscribe stores the user agent as evidence.
    response = await rig.client.post(
        f"/unsubscribe/{rig.token}",
        content=b"List-Unsubscribe=One-Click",
        headers=[
            (b"Content-Type", b"application/x-www-form-urlencoded"),
            (b"User-Agent", value),
        ],
    )
    await rig.refused(response, f"unsubscribe user agent {kind}")
    # A hostile bearer secret is only ever hashed: 401.
    response = await rig.client.get("/v1/dlq", headers=[(b"Authorization", b"Bearer " + value)])
    await rig.refused(response, f"authorization {kind}")


# --- issue 12: leniency that hides mistakes ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/messages", _EMAIL),
        ("/v1/keys", {"scopes": ["read"]}),
        ("/v1/suppressions", {"channel": "email", "address": "a@example.com", "reason": "manual"}),
        ("/v1/suppressions/check", {"channel": "email", "addresses": ["a@example.com"]}),
        ("/v1/dlq/redrive", {"all": True}),
        ("/v1/dlq/{entry}/redrive", {"note": "n"}),
    ],
)
async def test_json_routes_refuse_other_content_types_and_unknown_fields(
    rig: Rig, path: str, body: dict[str, Any]
) -> None:
    path = path.format(entry=rig.entry)
    raw = json.dumps(body).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**rig.admin, "Idempotency-Key": '"ct-1"'}
        if content_type:
            headers["Content-Type"] = content_type
        response = await rig.client.post(path, content=raw, headers=headers)
        assert response.status_code == 415, (path, content_type, response.text)
        await rig.refused(response, f"{path} {content_type}")
    response = await rig.request("POST", path, body={**body, "unexpected": "x"})
    assert response.status_code == 400, (path, response.text)
    assert "unexpected" in response.text
    await rig.refused(response, f"{path} unknown field")


async def test_json_with_a_charset_or_a_json_suffix_is_fine(rig: Rig) -> None:
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        headers = {**rig.admin, "Content-Type": content_type}
        response = await rig.client.post(
            "/v1/keys", content=json.dumps({"scopes": ["read"]}).encode(), headers=headers
        )
        assert response.status_code == 201, (content_type, response.text)


async def test_a_number_that_is_possible_but_not_valid_is_422_with_why(rig: Rig) -> None:
    # `555-0100` used to be accepted as +15550100 (not dialable) and showed `sent`.
    for number in ("555-0100", "+15550100", "+447700900123"):
        body = {"channel": "sms", "to": [number], "body": "b"}
        response = await rig.request("POST", "/v1/messages", body=body)
        assert response.status_code == 422, (number, response.text)
        (error,) = response.json()["errors"]
        assert "is not a valid number for country code" in error["problem"], error
        await rig.refused(response, number)
    problem = response.json()["errors"][0]["problem"]
    assert problem.startswith("+447700900123 is not a valid number for country code +44 (GB")
    national = await rig.request(
        "POST", "/v1/messages", body={"channel": "sms", "to": ["555-0100"], "body": "b"}
    )
    assert "read as a national number of US" in national.json()["errors"][0]["problem"]
    # New suppressions and checks hold numbers to the same rule.
    response = await rig.request(
        "POST",
        "/v1/suppressions",
        body={"channel": "sms", "address": "555-0100", "reason": "manual"},
    )
    assert response.status_code == 422, response.text
    await rig.refused(response, "suppression")
    response = await rig.request(
        "POST", "/v1/suppressions/check", body={"channel": "sms", "addresses": ["555-0100"]}
    )
    assert response.status_code == 200
    assert [i["address"] for i in response.json()["invalid"]] == ["555-0100"]


async def test_the_sandbox_magic_numbers_and_real_ones_are_valid(rig: Rig) -> None:
    from sender.providers.sandbox import MAGIC_FROM, MAGIC_FROM_ERRORS, MAGIC_TO
    from suppression.normalize import normalize_phone

    for number in [*MAGIC_TO, *MAGIC_FROM_ERRORS, MAGIC_FROM, "+14155550100", "(415) 555-0100"]:
        assert normalize_phone(number, "US", strict=True).key.startswith("+1"), number
    body = {"channel": "sms", "to": ["+15005550006", "(415) 555-0100"], "body": "b"}
    response = await rig.request("POST", "/v1/messages", body=body)
    assert response.status_code in (201, 202), response.text
