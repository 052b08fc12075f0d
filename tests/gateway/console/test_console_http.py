"""The console over plain HTTP: sign-in, session expiry and revocation, CSRF, scopes, pages."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable

import httpx
from sqlalchemy import select

from gateway.console import session as console_session
from gateway.keys import revoke_key
from gateway.models import ApiKey
from gateway.services import Services
from tests.conftest import bearer

MakeKey = Callable[..., Awaitable[str]]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    """Open the sign-in page and post the key; returns the answer to the post."""
    page = await client.get("/console/login")
    assert page.status_code == 200
    return await client.post("/console/login", data={"key": secret, "csrf": _csrf(page.text)})


async def test_pages_need_a_session(client: httpx.AsyncClient) -> None:
    for path in ("/console/", "/console/address", "/console/dlq", "/console/suppressions"):
        answer = await client.get(path)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/console/login")


async def test_sign_in_sets_a_strict_httponly_cookie_and_shows_the_overview(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    answer = await sign_in(client, await make_key("read", name="ops"))
    assert answer.status_code == 303
    cookie = next(
        v for k, v in answer.headers.multi_items() if k == "set-cookie" and "gw_console=" in v
    )
    lowered = cookie.lower()
    assert "httponly" in lowered and "samesite=strict" in lowered and "max-age=28800" in lowered
    # The test settings' public URL is https: the cookie is Secure.
    assert "secure" in lowered
    page = await client.get("/console/")
    assert page.status_code == 200
    assert "<title>Overview" in page.text
    assert "ops" in page.text


async def test_a_wrong_or_send_only_key_is_refused(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    assert (await sign_in(client, "gw_nonsense")).status_code == 401
    assert (await sign_in(client, await make_key("send"))).status_code == 403
    assert (await client.get("/console/")).status_code == 303


async def test_sign_in_without_the_form_token_is_refused(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    secret = await make_key("admin")
    answer = await client.post("/console/login", data={"key": secret, "csrf": "forged"})
    assert answer.status_code == 403
    assert (await client.get("/console/")).status_code == 303


async def test_a_revoked_key_ends_its_sessions_at_the_next_request(
    services: Services, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    secret = await make_key("admin", name="soon revoked")
    await sign_in(client, secret)
    assert (await client.get("/console/")).status_code == 200
    async with services.sessions() as s:
        key_id = (await s.scalars(select(ApiKey.id).where(ApiKey.name == "soon revoked"))).one()
        assert await revoke_key(s, key_id)
        await s.commit()
    answer = await client.get("/console/")
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/console/login")


async def test_an_expired_or_forged_session_is_refused(
    services: Services, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    await make_key("admin", name="k")
    async with services.sessions() as s:
        key_id = (await s.scalars(select(ApiKey.id).where(ApiKey.name == "k"))).one()
    key = console_session.signing_key(services.settings.hash_key)
    old = console_session.new_session(key_id, now=1_000_000)
    client.cookies.set("gw_console", console_session.encode(key, old), path="/console")
    assert (await client.get("/console/")).status_code == 303
    fresh = console_session.new_session(key_id)
    forged = console_session.encode(b"another key" * 3, fresh)
    client.cookies.set("gw_console", forged, path="/console")
    assert (await client.get("/console/")).status_code == 303
    client.cookies.set("gw_console", console_session.encode(key, fresh), path="/console")
    assert (await client.get("/console/")).status_code == 200
    # A session for a key id that does not exist.
    other = console_session.new_session(uuid.uuid4())
    client.cookies.set("gw_console", console_session.encode(key, other), path="/console")
    assert (await client.get("/console/")).status_code == 303


async def test_a_change_without_the_csrf_token_is_refused(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    await sign_in(client, await make_key("admin"))
    form = {"channel": "email", "address": "someone@example.com", "reason": "manual"}
    answer = await client.post("/console/address/suppress", data={**form, "csrf": "nope"})
    assert answer.status_code == 403
    page = await client.get(
        "/console/address", params={"channel": "email", "address": "someone@example.com"}
    )
    assert "not suppressed" in page.text
    answer = await client.post("/console/address/suppress", data={**form, "csrf": _csrf(page.text)})
    assert answer.status_code == 303
    page = await client.get(answer.headers["location"])
    assert 'id="verdict">suppressed' in page.text


async def test_a_read_key_sees_no_actions_and_is_refused_them(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    admin = bearer(await make_key("admin"))
    created = await client.post(
        "/v1/suppressions",
        json={"channel": "email", "address": "gone@example.com", "reason": "hard_bounce"},
        headers=admin,
    )
    assert created.status_code == 201
    await sign_in(client, await make_key("read"))
    page = await client.get(
        "/console/address", params={"channel": "email", "address": "gone@example.com"}
    )
    assert page.status_code == 200
    assert "hard_bounce" in page.text
    assert "Remove suppression" not in page.text and "Add suppression" not in page.text
    answer = await client.post(
        "/console/address/unsuppress",
        data={
            "channel": "email",
            "address": "gone@example.com",
            "reason": "x",
            "csrf": _csrf(page.text),
        },
    )
    assert answer.status_code == 403
    assert "scope admin" in answer.text
    still = await client.get("/v1/suppressions/email/gone@example.com", headers=admin)
    assert still.json()["suppressed"] is True
    assert (await client.get("/console/suppressions/export")).status_code == 403


async def test_removing_a_complaint_needs_the_force_confirmation(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    admin = bearer(await make_key("admin"))
    await client.post(
        "/v1/suppressions",
        json={"channel": "email", "address": "angry@example.com", "reason": "complaint"},
        headers=admin,
    )
    await sign_in(client, await make_key("admin"))
    page = await client.get(
        "/console/address", params={"channel": "email", "address": "angry@example.com"}
    )
    form = {
        "channel": "email",
        "address": "angry@example.com",
        "reason": "asked us",
        "csrf": _csrf(page.text),
    }
    refused = await client.post("/console/address/unsuppress", data=form)
    assert refused.status_code == 409
    assert 'id="force"' in refused.text
    done = await client.post("/console/address/unsuppress", data={**form, "force": "yes"})
    assert done.status_code == 303
    page = await client.get(done.headers["location"])
    assert "not suppressed" in page.text and "asked us" in page.text


async def test_export_streams_the_api_csv_and_import_reports(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    admin_secret = await make_key("admin")
    await sign_in(client, admin_secret)
    page = await client.get("/console/suppressions")
    upload = (
        b"channel,address,reason,scope\n"
        b"email,imp@example.com,hard_bounce,all\n"
        b"email,not-an-address,hard_bounce,all\n"
    )
    report = await client.post(
        "/console/suppressions/import",
        data={"csrf": _csrf(page.text), "format": "auto", "unsubscribe_scope": "marketing"},
        files={"file": ("list.csv", upload, "text/csv")},
    )
    assert report.status_code == 200, report.text
    assert re.search(r'data-field="added">1<', report.text)
    assert re.search(r'data-field="invalid_count">1<', report.text)
    console_csv = await client.get("/console/suppressions/export")
    api_csv = await client.get("/v1/suppressions/export", headers=bearer(admin_secret))
    assert console_csv.status_code == 200
    assert console_csv.headers["content-type"].startswith("text/csv")
    assert console_csv.text == api_csv.text
    assert "imp@example.com" in console_csv.text


async def test_logout_drops_the_session(client: httpx.AsyncClient, make_key: MakeKey) -> None:
    await sign_in(client, await make_key("read"))
    page = await client.get("/console/")
    answer = await client.post("/console/logout", data={"csrf": _csrf(page.text)})
    assert answer.status_code == 303
    assert (await client.get("/console/")).status_code == 303


async def test_bad_input_gets_a_page_not_a_500(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    await sign_in(client, await make_key("admin"))
    assert (await client.get("/console/messages/not-a-uuid")).status_code == 404
    assert (await client.get(f"/console/messages/{uuid.uuid4()}")).status_code == 404
    assert (await client.get("/console/dlq", params={"channel": "fax"})).status_code == 400
    assert (await client.get("/console/dlq", params={"age": "forever"})).status_code == 400
    assert (await client.get("/console/suppressions", params={"cursor": "zz"})).status_code == 400
    assert (
        await client.get("/console/address", params={"channel": "email", "address": "nope"})
    ).status_code == 422
    assert (await client.get(f"/console/dlq/{uuid.uuid4()}")).status_code == 404


async def test_a_message_page_shows_events_but_no_hash_or_secret(
    services: Services, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    sender_key = await make_key("send", "read", name="upstream")
    sent = await client.post(
        "/v1/messages",
        json={
            "channel": "email",
            "to": ["bounce@simulator.amazonses.com"],
            "subject": "Hi",
            "text": "Hi",
            "category": "marketing",
        },
        headers={**bearer(sender_key), "Idempotency-Key": uuid.uuid4().hex},
    )
    assert sent.status_code == 201, sent.text
    await services.sandbox_feedback.drain()
    message_id = uuid.UUID(sent.json()["id"])
    async with services.sessions() as s:
        from sender import log as dlog
        from suppression.db import pg_of

        delivery = (await dlog.deliveries_of(await pg_of(s), message_id))[0]
    await sign_in(client, await make_key("admin"))
    page = await client.get(f"/console/messages/{message_id}")
    assert page.status_code == 200
    assert 'bounce: <span class="disp">applied</span>' in page.text
    assert "raw payload" in page.text
    assert delivery.derived_key not in page.text
    assert delivery.recipient_hash not in page.text
    assert "unsubscribe/" not in page.text.lower().replace("list-unsubscribe", "")
    # A read key that did not send it does not see it (as GET /v1/messages/{id}).
    client.cookies.clear()
    await sign_in(client, await make_key("read"))
    assert (await client.get(f"/console/messages/{message_id}")).status_code == 404
    client.cookies.clear()
    await sign_in(client, sender_key)
    assert (await client.get(f"/console/messages/{message_id}")).status_code == 200


async def _dead_letters(services: Services, n: int, *, provider: str = "twilio") -> list[uuid.UUID]:
    """n dead-lettered SMS deliveries whose one attempt went to `provider`."""
    import datetime as dt

    from sender import log as dlog
    from suppression.db import pg_of, utcnow
    from tests.retry.helpers import insert_deliveries
    from tests.support.tables import attempts

    ids = []
    async with services.sessions() as s, s.begin():
        for delivery_id in await insert_deliveries(s, n, channel="sms", attempts_made=1):
            at = utcnow() - dt.timedelta(hours=2)
            await s.execute(
                attempts.insert().values(
                    id=uuid.uuid4(),
                    delivery_id=delivery_id,
                    number=1,
                    status="transient",
                    provider=provider,
                    error_code="30003",
                    error_message="unreachable",
                    started_at=at,
                    finished_at=at,
                )
            )
            entry = await dlog.dead_letter(
                await pg_of(s), delivery_id, reason="max_attempts", last_error="30003", now=at
            )
            assert entry is not None
            ids.append(entry)
    return ids


async def test_dead_letters_filter_confirm_discard_and_refuse_twice(
    services: Services, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    twilio = await _dead_letters(services, 2)
    ses = await _dead_letters(services, 1, provider="ses")
    await sign_in(client, await make_key("admin"))
    page = await client.get("/console/dlq", params={"provider": "twilio", "age": "1h"})
    assert page.status_code == 200
    assert all(str(i) in page.text for i in twilio) and str(ses[0]) not in page.text
    assert (await client.get("/console/dlq", params={"age": "24h"})).text.count('name="ids"') == 0
    selected = await client.get("/console/dlq", params={"provider": "twilio", "select": "all"})
    assert selected.text.count(" checked") == 2
    form = {"csrf": _csrf(page.text), "action": "discard", "ids": [str(i) for i in twilio]}
    confirm = await client.post("/console/dlq/action", data=form)
    assert confirm.status_code == 200
    assert "Discard 2 dead-letter entries?" in confirm.text
    # Confirmed without a reason: refused, nothing changes.
    no_reason = await client.post("/console/dlq/action", data={**form, "confirmed": "yes"})
    assert no_reason.status_code == 400
    still = await client.get("/console/dlq", params={"provider": "twilio"})
    assert all(str(i) in still.text for i in twilio)
    done = await client.post(
        "/console/dlq/action", data={**form, "confirmed": "yes", "reason": "customer left"}
    )
    assert done.status_code == 200 and "2 entries discarded" in done.text
    again = await client.post(
        "/console/dlq/action",
        data={**form, "action": "redrive", "confirmed": "yes"},
    )
    assert again.status_code == 409
    assert "0 entries redriven" in again.text and "already discarded" in again.text
    entry = await client.get(f"/console/dlq/{twilio[0]}")
    assert "customer left" in entry.text and 'id="entry-state">discarded' in entry.text


async def test_an_address_is_normalized_as_the_send_path_does(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    admin = bearer(await make_key("admin"))
    added = await client.post(
        "/v1/suppressions",
        json={"channel": "sms", "address": "+15005550006", "reason": "sms_stop"},
        headers=admin,
    )
    assert added.status_code == 201
    await sign_in(client, await make_key("read"))
    page = await client.get(
        "/console/address", params={"channel": "sms", "address": "(500) 555-0006"}
    )
    assert page.status_code == 200
    assert "+15005550006" in page.text and 'id="verdict">suppressed' in page.text


async def test_an_added_suppression_can_expire(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    await sign_in(client, await make_key("admin"))
    page = await client.get(
        "/console/address", params={"channel": "email", "address": "t@example.com"}
    )
    form = {
        "channel": "email",
        "address": "t@example.com",
        "reason": "manual",
        "scope": "all",
        "csrf": _csrf(page.text),
    }
    past = await client.post(
        "/console/address/suppress", data={**form, "expires_at": "2001-01-01T00:00"}
    )
    assert past.status_code == 422 and "in the past" in past.text
    bad = await client.post("/console/address/suppress", data={**form, "expires_at": "soon"})
    assert bad.status_code == 422
    done = await client.post(
        "/console/address/suppress", data={**form, "expires_at": "2999-01-01T00:00"}
    )
    assert done.status_code == 303
    page = await client.get(done.headers["location"])
    assert "2999-01-01 00:00:00 UTC" in page.text and 'id="verdict">suppressed' in page.text
