"""`GET /v1/events` and `GET /v1/messages` over HTTP: visibility per key, filters, cursors,
validation."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from gateway import cli
from gateway.services import Services
from tests.conftest import bearer, gateway_env
from tests.sender.helpers import email, sms

MakeKey = Callable[..., Awaitable[str]]


async def _send(client: httpx.AsyncClient, secret: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(
        "/v1/messages",
        json=body,
        headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
    )
    assert r.status_code in (201, 202), r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _events(client: httpx.AsyncClient, secret: str, **params: Any) -> list[dict[str, Any]]:
    """Every event the key may see, page by page through next_cursor."""
    out: list[dict[str, Any]] = []
    after = None
    while True:
        query = {**params, **({"after": after} if after else {})}
        r = await client.get("/v1/events", params=query, headers=bearer(secret))
        assert r.status_code == 200, r.text
        page = r.json()
        out.extend(page["items"])
        after = page["next_cursor"]
        assert after
        if not page["items"]:
            return out


async def test_each_key_sees_its_own_messages_events_and_every_suppression_event(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    alice = await make_key("send", "read")
    bob = await make_key("send", "read")
    admin = await make_key("admin")
    sender_only = await make_key("send")
    a = await _send(client, alice, email("bounce@simulator.amazonses.com"))
    b = await _send(client, bob, email("success@simulator.amazonses.com"))
    await services.sandbox_feedback.drain()

    seen_by_alice = await _events(client, alice)
    assert [e["type"] for e in seen_by_alice] == [
        "delivery.sent",
        "delivery.bounced",
        "suppression.added",
    ]
    assert {e["data"].get("message_id") for e in seen_by_alice} == {a["id"], None}
    seen_by_bob = await _events(client, bob)
    # in commit order: Alice's bounce suppressed the address before Bob's delivery arrived
    assert sorted(e["type"] for e in seen_by_bob) == [
        "delivery.delivered",
        "delivery.sent",
        "suppression.added",
    ]
    assert [e["type"] for e in seen_by_bob if e["type"].startswith("delivery.")] == [
        "delivery.sent",
        "delivery.delivered",
    ]
    assert seen_by_bob[0]["data"]["message_id"] == b["id"]
    assert seen_by_bob[0]["data"]["to"] == "success@simulator.amazonses.com"
    everything = await _events(client, admin)
    assert len(everything) == 5
    assert {e["id"] for e in everything} == {e["id"] for e in seen_by_alice + seen_by_bob}

    only = await _events(client, admin, types="delivery.bounced, suppression.added")
    assert [e["type"] for e in only] == ["delivery.bounced", "suppression.added"]
    one_by_one = await _events(client, admin, limit=1)
    assert [e["id"] for e in one_by_one] == [e["id"] for e in everything]

    r = await client.get("/v1/events", headers=bearer(sender_only))
    assert r.status_code == 403
    r = await client.get("/v1/events")
    assert r.status_code == 401


async def test_feed_refuses_bad_cursor_limit_and_types(
    client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    secret = await make_key("read")
    for params, problem in [
        ({"after": "nonsense"}, "urn:problem:invalid-cursor"),
        ({"after": "1.2.3"}, "urn:problem:invalid-cursor"),
        ({"after": "99999999999999999999.1"}, "urn:problem:invalid-cursor"),
        ({"types": "delivery.opened"}, "urn:problem:unknown-event-type"),
        ({"types": ","}, "urn:problem:unknown-event-type"),
        ({"limit": "0"}, None),
        ({"limit": "1001"}, None),
        ({"limit": "many"}, None),
    ]:
        r = await client.get("/v1/events", params=params, headers=bearer(secret))
        assert r.status_code == 400, (params, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        if problem:
            assert r.json()["type"] == problem
    r = await client.get("/v1/events", params={"limit": "1000"}, headers=bearer(secret))
    assert r.status_code == 200 and r.json()["items"] == []


async def _search(
    client: httpx.AsyncClient, secret: str, **params: Any
) -> tuple[list[dict[str, Any]], httpx.Response]:
    r = await client.get("/v1/messages", params=params, headers=bearer(secret))
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items, r


async def test_search_by_address_finds_exactly_that_address(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    alice = await make_key("send", "read")
    bob = await make_key("send", "read")
    admin = await make_key("admin")
    first = await _send(client, alice, email("jane@example.com", metadata={"order": "1"}))
    both = await _send(client, alice, email(["Jane@Example.COM", "john@example.com"]))
    other = await _send(client, alice, email("janet@example.com", metadata={"order": "2"}))
    text = await _send(client, alice, sms("+15005550006"))
    bobs = await _send(client, bob, email("jane@example.com"))
    await services.sandbox_feedback.drain()

    found, _ = await _search(client, alice, to=" JANE@example.com")
    assert [m["id"] for m in found] == [both["id"], first["id"]]  # newest first
    assert [d["to"].lower() for d in found[0]["deliveries"]] == [
        "jane@example.com",
        "john@example.com",
    ]
    assert {d["status"] for d in found[0]["deliveries"]} == {"delivered"}
    found, _ = await _search(client, admin, to="jane@example.com")
    assert [m["id"] for m in found] == [bobs["id"], both["id"], first["id"]]
    found, _ = await _search(client, bob, to="jane@example.com")
    assert [m["id"] for m in found] == [bobs["id"]]
    found, _ = await _search(client, alice, to="+1 500 555 0006")
    assert [m["id"] for m in found] == [text["id"]]
    found, _ = await _search(client, alice, to="nobody@example.com")
    assert found == []

    found, _ = await _search(client, alice)
    assert [m["id"] for m in found] == [text["id"], other["id"], both["id"], first["id"]]
    found, _ = await _search(client, alice, channel="email", **{"metadata[order]": "2"})
    assert [m["id"] for m in found] == [other["id"]]
    found, _ = await _search(client, alice, channel="sms", status="delivered")
    assert [m["id"] for m in found] == [text["id"]]
    found, _ = await _search(client, alice, status="bounced")
    assert found == []
    found, _ = await _search(client, alice, to="john@example.com", status="delivered")
    assert [m["id"] for m in found] == [both["id"]]
    found, _ = await _search(client, alice, to="john@example.com", status="bounced")
    assert found == []

    # pages of one, following next_cursor, give the same list
    pages: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        items, r = await _search(client, alice, **params)
        pages += [m["id"] for m in items]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == [text["id"], other["id"], both["id"], first["id"]]


async def test_search_refuses_bad_parameters(client: httpx.AsyncClient, make_key: MakeKey) -> None:
    secret = await make_key("read")
    for params, status, problem in [
        ({"cursor": "x"}, 400, "urn:problem:invalid-cursor"),
        ({"cursor": "1_" + "g" * 32}, 400, "urn:problem:invalid-cursor"),
        ({"cursor": "123456789012345678_" + "0" * 32}, 400, None),
        ({"limit": "0"}, 400, None),
        ({"limit": "201"}, 400, None),
        ({"status": "lost"}, 400, None),
        ({"channel": "fax"}, 400, None),
        ({"since": "yesterday"}, 400, None),
        ({"metadata[]": "x"}, 400, "urn:problem:invalid-query"),
        ({"metadata": "x"}, 400, "urn:problem:invalid-query"),
        ({"to": "not an address"}, 422, "urn:problem:invalid-address"),
        ({"to": "12", "channel": "sms"}, 422, "urn:problem:invalid-address"),
    ]:
        r = await client.get("/v1/messages", params=params, headers=bearer(secret))
        assert r.status_code == status, (params, r.text)
        if problem:
            assert r.json()["type"] == problem, (params, r.text)


async def test_events_tail_prints_json_lines(
    client: httpx.AsyncClient,
    services: Services,
    make_key: MakeKey,
    monkeypatch: Any,
    capsys: Any,
) -> None:
    secret = await make_key("send", "read")
    await _send(client, secret, email("bounce@simulator.amazonses.com"))
    await services.sandbox_feedback.drain()
    assert services.settings.database_url is not None
    for name, value in gateway_env(services.settings.database_url).items():
        monkeypatch.setenv(name, value)
    argv = ["events", "tail", "--from-start", "--no-follow", "--types", "delivery.bounced"]
    code = await asyncio.to_thread(cli.main, argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    import json

    lines = [json.loads(line) for line in out.splitlines()]
    assert [e["type"] for e in lines] == ["delivery.bounced"]
    assert lines[0]["data"]["to"] == "bounce@simulator.amazonses.com"
    cursor = err.strip().rsplit(" ", 1)[-1]
    # resuming after the printed cursor prints nothing new
    code = await asyncio.to_thread(cli.main, ["events", "tail", "--after", cursor, "--no-follow"])
    out, _ = capsys.readouterr()
    assert code == 0 and out == ""
    code = await asyncio.to_thread(cli.main, ["events", "tail", "--types", "delivery.opened"])
    assert code == 2
