"""Import (every format, bad rows, streaming) and export (content, history, constant memory)."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import gc
import io
import json
import sys
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from litestar import Litestar
from sqlalchemy import func, select, text

from gateway.app import create_app
from gateway.services import Services, build_services
from gateway.settings import Settings
from suppression import service
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import normalize
from tests.conftest import bearer, replace_settings

MakeKey = Callable[..., Awaitable[str]]


async def _entries(services: Services) -> dict[tuple[str, str], tuple[str, str | None]]:
    """(channel, address) -> (reason, scope) for every entry, decrypting addresses."""
    async with services.sessions() as s:
        rows = (await s.execute(select(Suppression))).scalars().all()
    return {
        (
            r.channel,
            services.protector.decrypt(r.address_encrypted) if r.address_encrypted else "-",
        ): (
            r.reason,
            r.scope,
        )
        for r in rows
    }


async def _import(
    client: httpx.AsyncClient, key: str, body: bytes | str, **params: str
) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else body
    return await client.post(
        "/v1/suppressions/import", content=content, params=params, headers=bearer(key)
    )


async def test_import_of_each_format_reports_added_present_and_invalid(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    admin = await make_key("admin")
    ses = (
        "EmailAddress,Reason,LastUpdateTime\n"
        "b1@example.com,BOUNCE,1711965600\n"
        "c1@example.com,COMPLAINT,\n"
        "bad,BOUNCE,\n"
    )
    r = await _import(client, admin, ses)
    assert r.status_code == 200, r.text
    report = r.json()
    assert (report["added"], report["already_present"], report["invalid_count"]) == (2, 0, 1)
    assert report["invalid"] == [{"line": 4, "error": report["invalid"][0]["error"]}]

    sendgrid = (
        "email,created,reason,status\n"
        "B1@example.com,1711965600,550 5.1.1 <b1@example.com> unknown,5.1.1\n"  # already there
        "b2@example.com,1711965600,550 5.1.1 unknown user,5.1.1\n"
        "b2@example.com,1711965601,550 5.1.1 unknown user,5.1.1\n"  # repeated in the file
    )
    r = await _import(client, admin, sendgrid)
    assert (r.json()["added"], r.json()["already_present"], r.json()["invalid_count"]) == (1, 2, 0)

    spam = "email,created,ip\nspam@example.com,1711965600,192.0.2.7\n"
    assert (await _import(client, admin, spam)).json()["added"] == 1
    unsub = '{"email": "u@example.com", "created": 1711965600}\n'
    r = await _import(client, admin, unsub, sendgrid_list="unsubscribes", unsubscribe_scope="news")
    assert r.json()["added"] == 1
    ours = (
        "channel,address,scope,reason,expires_at\n"
        "sms,+12025550143,all,sms_stop,\n"
        "email,,all,manual,\n"
        "email,m@example.com,promo,unsubscribe,\n"
    )
    r = await _import(client, admin, ours, format="gateway")
    assert (r.json()["added"], r.json()["invalid_count"]) == (2, 1)

    assert await _entries(services) == {
        ("email", "b1@example.com"): ("hard_bounce", "all"),
        ("email", "c1@example.com"): ("complaint", "all"),
        ("email", "b2@example.com"): ("hard_bounce", "all"),
        ("email", "spam@example.com"): ("complaint", "all"),
        ("email", "u@example.com"): ("unsubscribe", "news"),
        ("sms", "+12025550143"): ("sms_stop", "all"),
        ("email", "m@example.com"): ("unsubscribe", "promo"),
    }
    # every add is in history, attributed to the key and the import; the repeats are not adds
    async with services.sessions() as s:
        history = (await s.execute(select(SuppressionHistory))).scalars().all()
        evidence = (await s.execute(select(Suppression.evidence))).scalars().all()
    assert len(history) == 7 and {h.action for h in history} == {"add"}
    assert {h.source_type for h in history} == {"import"}
    assert all(h.actor.startswith("api_key:") for h in history)
    assert "b1@example.com" not in json.dumps(evidence) and "b2@example.com" not in json.dumps(
        evidence
    )


async def test_import_rejects_what_it_cannot_read_and_caps_the_invalid_list(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    admin = await make_key("admin")
    r = await _import(client, admin, "name,phone\nx,y\n")
    assert r.status_code == 400 and r.json()["type"] == "urn:problem:unrecognized-import-format"
    r = await _import(client, admin, "email,created\nu@example.com,1\n", format="ses")
    assert r.status_code == 400
    for params in ({"format": "excel"}, {"sendgrid_list": "nope"}, {"unsubscribe_scope": "a b"}):
        assert (await _import(client, admin, "email\n", **params)).status_code == 400
    body = (
        "channel,address,reason\n" + "email,bad,manual\n" * 150 + "email,fine@example.com,manual\n"
    )
    report = (await _import(client, admin, body)).json()
    assert (report["added"], report["invalid_count"], len(report["invalid"])) == (1, 150, 100)
    assert report["invalid"][0]["line"] == 2 and report["invalid"][-1]["line"] == 101
    r = await _import(client, await make_key("read", "export"), body)
    assert r.status_code == 403


async def test_import_streams_a_chunked_body_larger_than_the_body_limit(
    settings: Settings, services: Services, make_key: MakeKey
) -> None:
    admin = await make_key("admin")
    rows = 3000

    async def body() -> AsyncIterator[bytes]:
        yield b"channel,address,reason\n"
        for start in range(0, rows, 500):
            lines = [
                f"email,user{i}.{'x' * 40}@example.com,manual\n" for i in range(start, start + 500)
            ]
            yield "".join(lines).encode()

    # The body (~200 kB, sent chunked) is far over this app's body limit, which the import
    # route does not apply because it streams.
    small = replace_settings(settings, max_body_bytes=4096)
    assert small.database_url is not None
    other = build_services(small, small.database_url)
    try:
        transport = httpx.ASGITransport(app=create_app(other))
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            r = await c.post("/v1/suppressions/import", content=body(), headers=bearer(admin))
            assert r.status_code == 200, r.text
            assert r.json()["added"] == rows
            too_big = {"scopes": ["read"], "name": "x" * 5000}
            r = await c.post("/v1/keys", json=too_big, headers=bearer(admin))
            assert r.status_code == 413  # the limit is in force elsewhere
    finally:
        await other.close()
    async with services.sessions() as s:
        assert (await s.execute(select(func.count()).select_from(Suppression))).scalar_one() == rows


async def _seed_for_export(services: Services) -> None:
    p = services.protector
    async with services.sessions() as s:
        op = service.Source("operator", "k", actor="api_key:k")
        await service.add(
            s,
            p,
            normalize("email", "a@example.com"),
            reason="complaint",
            source=service.Source("provider_event", "evt-9"),
        )
        await service.add(
            s,
            p,
            normalize("email", "b@example.com"),
            reason="unsubscribe",
            scope="marketing",
            source=op,
        )
        await service.remove(
            s,
            "email",
            p.hash("email", "b@example.com"),
            reason="mistake",
            source=op,
            scope="marketing",
        )
        await service.add(
            s,
            p,
            normalize("email", "b@example.com"),
            reason="unsubscribe",
            scope="marketing",
            source=op,
        )
        await service.add(s, p, normalize("sms", "+12025550143"), reason="sms_stop", source=op)
        await s.commit()


async def test_export_csv_and_jsonl_with_history_and_since(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed_for_export(services)
    key = bearer(await make_key("export"))
    r = await client.get("/v1/suppressions/export", params={"format": "jsonl"}, headers=key)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    assert "attachment" in r.headers["content-disposition"]
    items = [json.loads(line) for line in r.text.splitlines()]
    assert [(i["address"], i["reason"], i["scope"]) for i in items] == [
        ("a@example.com", "complaint", "all"),
        ("b@example.com", "unsubscribe", "marketing"),
        ("+12025550143", "sms_stop", "all"),
    ]
    assert items[0]["source_type"] == "provider_event" and items[0]["source_id"] == "evt-9"
    assert items[0]["created_at"] and items[0]["expires_at"] is None and items[0]["active"] is True
    # b's history spans the removed first incarnation too
    assert [h["action"] for h in items[1]["history"]] == ["add", "remove", "add"]
    assert items[1]["history"][1]["details"]["removal_reason"] == "mistake"

    r = await client.get("/v1/suppressions/export", headers=key)
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [row["address"] for row in rows] == ["a@example.com", "b@example.com", "+12025550143"]
    assert [h["action"] for h in json.loads(rows[1]["history"])] == ["add", "remove", "add"]

    later = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)).isoformat()
    r = await client.get("/v1/suppressions/export", params={"since": later}, headers=key)
    assert r.text.splitlines() == [r.text.splitlines()[0]]  # the header only
    assert (
        await client.get("/v1/suppressions/export", params={"format": "xml"}, headers=key)
    ).status_code == 400
    read_only = bearer(await make_key("read"))
    assert (await client.get("/v1/suppressions/export", headers=read_only)).status_code == 403


async def test_our_export_imports_back(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed_for_export(services)
    before = await _entries(services)
    exported = {}
    for fmt in ("csv", "jsonl"):
        r = await client.get(
            "/v1/suppressions/export",
            params={"format": fmt},
            headers=bearer(await make_key("export")),
        )
        exported[fmt] = r.content
    admin = await make_key("admin")
    for fmt, body in exported.items():
        async with services.sessions() as s:
            await s.execute(text("TRUNCATE suppressions, suppression_history"))
            await s.commit()
        report = (await _import(client, admin, body)).json()
        assert (report["added"], report["invalid_count"]) == (3, 0), fmt
        assert await _entries(services) == before


async def test_export_of_100000_entries_streams_in_constant_memory(
    app: Litestar, services: Services, make_key: MakeKey
) -> None:
    count = 100_000
    ciphertext = services.protector.encrypt("bulk@example.com")
    async with services.sessions() as s:
        await s.execute(
            text(
                "INSERT INTO suppressions (id, channel, address_hash, address_encrypted, scope,"
                " reason, source_type, source_id, evidence, created_at)"
                " SELECT gen_random_uuid(), 'email', encode(sha256(i::text::bytea), 'hex'), :c,"
                " 'all', 'hard_bounce', 'provider_event', 'evt-' || i, '{}'::jsonb,"
                " now() - make_interval(secs => :n - i)"
                " FROM generate_series(1, :n) AS i"
            ),
            {"c": ciphertext, "n": count},
        )
        await s.commit()
    key = await make_key("export")
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "https",
        "path": "/v1/suppressions/export",
        "raw_path": b"/v1/suppressions/export",
        "query_string": b"format=jsonl",
        "root_path": "",
        "headers": [(b"host", b"gateway.test"), (b"authorization", f"Bearer {key}".encode())],
        "client": ("127.0.0.1", 5000),
        "server": ("gateway.test", 443),
    }
    seen = {"bytes": 0, "lines": 0, "status": 0, "chunks": 0}
    requested = False
    finished = asyncio.Event()
    # Two measures, because tracing every allocation of 100,000 rows would take minutes:
    # tracemalloc's exact peak over the request's start and its first ten batches, and the
    # count of live small-object blocks (free to read) after every chunk of the whole stream.
    traced_batches = 10
    blocks = {"start": 0, "max": 0}
    peak = {"bytes": 0}

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await finished.wait()  # like a server: the client stays connected until the end
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("more_body") is False:
            finished.set()
        if message["type"] == "http.response.start":
            seen["status"] = message["status"]
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            seen["bytes"] += len(body)
            seen["lines"] += body.count(b"\n")
            seen["chunks"] += 1  # the body itself is dropped here, like a socket would
            del body, message
            blocks["max"] = max(blocks["max"], sys.getallocatedblocks() - blocks["start"])
            if seen["chunks"] == traced_batches + 1:  # the header-less jsonl: chunk n = batch n
                peak["bytes"] = tracemalloc.get_traced_memory()[1] - peak["bytes"]
                tracemalloc.stop()

    gc.collect()
    blocks["start"] = sys.getallocatedblocks()
    tracemalloc.start()
    try:
        peak["bytes"] = tracemalloc.get_traced_memory()[0]
        await app(scope, receive, send)  # type: ignore[arg-type]
    finally:
        tracemalloc.stop()
    assert seen["status"] == 200 and seen["lines"] == count
    assert seen["chunks"] > 50  # sent batch by batch, not as one body
    # Holding the export would take at least its own size (and ~100 objects per row); the
    # stream keeps a batch or two alive at a time.
    assert seen["bytes"] > 25_000_000
    assert peak["bytes"] < 6_000_000, f"traced peak grew by {peak['bytes'] / 1e6:.1f} MB"
    assert blocks["max"] < 50_000, f"{blocks['max']} more live blocks"
