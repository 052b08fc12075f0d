"""RFC 8058 one-click unsubscribe over HTTP."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
from cryptography.fernet import Fernet
from sqlalchemy import func, select

from gateway.app import create_app
from gateway.services import Services, build_services
from gateway.settings import Settings
from suppression import service
from suppression.models import Suppression, SuppressionHistory
from suppression.tokens import issue_token
from tests.conftest import replace_settings

ONE_CLICK = {"List-Unsubscribe": "One-Click"}


def _token(services: Services, topic: str = "marketing", **kw: Any) -> str:
    return issue_token(
        services.protector,
        channel="email",
        address=kw.pop("address", "Reader@Example.com"),
        topic=topic,
        delivery_id=kw.pop("delivery_id", None),
    )


async def _state(services: Services) -> tuple[list[tuple[str, str, str]], int]:
    async with services.sessions() as s:
        entries = (
            await s.execute(
                select(Suppression.reason, Suppression.scope, Suppression.source_type).order_by(
                    Suppression.created_at
                )
            )
        ).all()
        history = (
            await s.execute(select(func.count()).select_from(SuppressionHistory))
        ).scalar_one()
    return [(r, sc, st) for r, sc, st in entries], history


async def test_one_click_post_urlencoded_records_evidence_and_repeats_change_nothing(
    client: httpx.AsyncClient, services: Services
) -> None:
    delivery = uuid.uuid4()
    token = _token(services, delivery_id=delivery)
    headers = {"User-Agent": "Gmail-One-Click/1.0"}
    r = await client.post(f"/unsubscribe/{token}", data=ONE_CLICK, headers=headers)
    assert r.status_code == 200, r.text
    assert "location" not in r.headers and r.headers["content-type"].startswith("text/html")
    assert await _state(services) == ([("unsubscribe", "marketing", "unsubscribe")], 1)
    async with services.sessions() as s:
        entry = (await s.execute(select(Suppression))).scalar_one()
    assert entry.source_id == str(delivery)
    assert entry.evidence["delivery_id"] == str(delivery)
    assert entry.evidence["user_agent"] == "Gmail-One-Click/1.0"
    assert entry.evidence["client_ip"] == "203.0.113.7"
    assert entry.evidence["at"] and entry.evidence["token_issued_at"]
    # a repeat is answered the same way and changes nothing, not even history
    for _ in range(2):
        r = await client.post(f"/unsubscribe/{token}", data=ONE_CLICK, headers=headers)
        assert r.status_code == 200
    assert await _state(services) == ([("unsubscribe", "marketing", "unsubscribe")], 1)
    # the topic is blocked for marketing mail, never for transactional mail
    h = services.protector.hash("email", "reader@example.com")
    async with services.sessions() as s:
        hit = await service.check(s, "email", h, category="marketing", topic="marketing")
        assert hit is not None and hit.reason == "unsubscribe"
        assert await service.check(s, "email", h, category="transactional") is None


async def test_one_click_post_multipart(client: httpx.AsyncClient, services: Services) -> None:
    token = _token(services, topic="newsletter")
    # a field without a filename: httpx then sends multipart/form-data
    r = await client.post(f"/unsubscribe/{token}", files={"List-Unsubscribe": (None, "One-Click")})
    assert r.status_code == 200, r.text
    assert await _state(services) == ([("unsubscribe", "newsletter", "unsubscribe")], 1)


async def test_get_only_shows_a_page_whose_button_posts_the_one_click_body(
    client: httpx.AsyncClient, services: Services
) -> None:
    token = _token(services, address="someone.private@example.com")
    for _ in range(3):  # link scanners fetch again and again
        r = await client.get(f"/unsubscribe/{token}")
        assert r.status_code == 200
    assert await _state(services) == ([], 0)
    page = r.text
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "someone.private" not in page and "s***@example.com" in page
    form = re.search(r"<form method=\"post\">(.*?)</form>", page, re.S)
    assert form is not None
    fields = dict(re.findall(r"name=\"([^\"]+)\" value=\"([^\"]+)\"", form.group(1)))
    assert fields == ONE_CLICK
    # submitting the page's form (to the same URL) unsubscribes
    r = await client.post(f"/unsubscribe/{token}", data=fields)
    assert r.status_code == 200
    assert await _state(services) == ([("unsubscribe", "marketing", "unsubscribe")], 1)


async def test_bad_tokens_and_bad_bodies_change_nothing(
    client: httpx.AsyncClient, services: Services
) -> None:
    token = _token(services)
    for method in ("GET", "POST"):
        for bad in ("garbage", token[:-5] + "AAAAA", Fernet.generate_key().decode()):
            r = await client.request(method, f"/unsubscribe/{bad}", data=ONE_CLICK)
            assert r.status_code == 400, (method, bad)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["type"] == "urn:problem:invalid-unsubscribe-token"
    for kwargs in (
        {},
        {"data": {"List-Unsubscribe": "Yes"}},
        {"data": {"unsubscribe": "One-Click"}},
        {"content": b"\xff\xfe", "headers": {"content-type": "application/x-www-form-urlencoded"}},
        {
            "content": b"--x\r\ngarbage",
            "headers": {"content-type": "multipart/form-data; boundary=x"},
        },
        {"json": {"List-Unsubscribe": "One-Click"}},
    ):
        r = await client.post(f"/unsubscribe/{token}", **kwargs)  # type: ignore[arg-type]
        assert r.status_code == 400, kwargs
        assert r.json()["type"] == "urn:problem:one-click-body-required"
    assert await _state(services) == ([], 0)
    # the plain RFC body without a content type is accepted
    r = await client.post(f"/unsubscribe/{token}", content=b"List-Unsubscribe=One-Click")
    assert r.status_code == 200


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


async def test_a_browser_following_a_bad_link_gets_a_page_saying_what_to_do(
    client: httpx.AsyncClient, services: Services
) -> None:
    token = _token(services)
    for method in ("GET", "POST"):
        for bad in ("garbage", token[:-5] + "AAAAA", Fernet.generate_key().decode()):
            r = await client.request(
                method, f"/unsubscribe/{bad}", data=ONE_CLICK, headers={"Accept": BROWSER_ACCEPT}
            )
            assert r.status_code == 400, (method, bad)
            assert r.headers["content-type"] == "text/html; charset=utf-8"
            assert "This unsubscribe link is not valid" in r.text
            assert "most recent message" in r.text  # what to do instead
            assert r.headers["cache-control"] == "no-store"
            assert r.headers["referrer-policy"] == "no-referrer"
            # API clients (explicit problem+json, JSON, or anything) keep the problem document.
            for accept in ("application/problem+json", "application/json", "*/*"):
                r = await client.request(
                    method, f"/unsubscribe/{bad}", data=ONE_CLICK, headers={"Accept": accept}
                )
                assert r.status_code == 400
                assert r.headers["content-type"].startswith("application/problem+json"), accept
                assert r.json()["type"] == "urn:problem:invalid-unsubscribe-token"
    # A valid link in a browser still shows the confirmation page, and nothing changed.
    r = await client.get(f"/unsubscribe/{token}", headers={"Accept": BROWSER_ACCEPT})
    assert r.status_code == 200 and "<form" in r.text
    assert await _state(services) == ([], 0)


async def test_tokens_made_with_an_older_key_still_work(
    settings: Settings, services: Services
) -> None:
    old_token = _token(services)  # made with the current first key
    rotated = replace_settings(
        settings, secret_keys=(Fernet.generate_key().decode(), *settings.secret_keys)
    )
    assert rotated.database_url is not None
    other = build_services(rotated, rotated.database_url)
    try:
        transport = httpx.ASGITransport(app=create_app(other))
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            r = await c.post(f"/unsubscribe/{old_token}", data=ONE_CLICK)
            assert r.status_code == 200, r.text
    finally:
        await other.close()
    assert await _state(services) == ([("unsubscribe", "marketing", "unsubscribe")], 1)
