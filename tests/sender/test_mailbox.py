"""The sandbox mailbox (`GET /v1/sandbox/messages`): what the sandbox accepted, its headers,
MIME and simulated callbacks; 404 with real providers; callbacks that survive a kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.services import Services
from gateway.settings import Settings
from sender.providers.sandbox import FeedbackRunner, SandboxRecord
from tests.conftest import bearer, gateway_env
from tests.sender.helpers import Gateway
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering

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


def _marketing(to: str) -> dict[str, Any]:
    return {
        "channel": "email",
        "to": [to],
        "subject": "Our autumn news",
        "text": "Hello from the newsletter.",
        "html": "<p>Hello from the newsletter.</p>",
        "category": "marketing",
    }


async def _mailbox(
    client: httpx.AsyncClient, secret: str, **params: str | int
) -> list[dict[str, Any]]:
    r = await client.get("/v1/sandbox/messages", params=params, headers=bearer(secret))
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


async def test_unsubscribe_round_trip_through_the_mailbox(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    secret = await make_key("send", "read")
    sent = await _send(client, secret, _marketing("Reader@Example.com"))
    [delivery] = sent["deliveries"]
    await services.sandbox_feedback.drain()

    # The mailbox finds the message by its recipient, spelled any way.
    [item] = await _mailbox(client, secret, to="reader@example.COM")
    assert item["delivery_id"] == delivery["id"]
    assert (item["channel"], item["subject"], item["last_event"]) == (
        "email",
        "Our autumn news",
        "Delivery",
    )
    r = await client.get(f"/v1/sandbox/messages/{item['id']}", headers=bearer(secret))
    assert r.status_code == 200, r.text
    shown = r.json()
    headers = {h["name"]: h["value"] for h in shown["headers"]}
    assert shown["list_unsubscribe"] == headers["List-Unsubscribe"]
    assert shown["list_unsubscribe_post"] == "List-Unsubscribe=One-Click"
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # The derived key travels as the X-Gateway-Delivery header and as an SES tag.
    assert shown["derived_key"] == headers["X-Gateway-Delivery"]
    assert shown["tags"]["derived_key"] == [shown["derived_key"]]
    assert shown["tags"]["delivery_id"] == [delivery["id"]]
    # (The Send event finds the delivery `sent` already: the send path recorded it.)
    assert [c["event"] for c in shown["callbacks"]] == ["Send", "Delivery"]
    assert shown["callbacks"][1]["result"] == "applied"
    assert all(c["delivered_at"] and c["payload"]["eventType"] for c in shown["callbacks"])
    link = shown["unsubscribe_url"]
    assert link.startswith("https://gateway.test/unsubscribe/")
    assert f"<{link}>" in shown["list_unsubscribe"]

    # RFC 8058 one-click: a POST of exactly this body, no key, no cookie.
    r = await client.post(
        link,
        content=b"List-Unsubscribe=One-Click",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200, r.text
    r = await client.get("/v1/suppressions/email/reader@example.com", headers=bearer(secret))
    assert r.status_code == 200, r.text
    assert r.json()["suppressed"] is True
    assert [(e["reason"], e["scope"]) for e in r.json()["entries"]] == [
        ("unsubscribe", "marketing")
    ]
    again = await _send(client, secret, _marketing("reader@example.com"))
    assert [(d["status"], d["reason"]) for d in again["deliveries"]] == [
        ("suppressed", "unsubscribe")
    ]
    # Nothing was handed to the sandbox for it.
    assert len(await _mailbox(client, secret, to="reader@example.com")) == 1


async def test_filter_channel_order_and_pages(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    secret = await make_key("send", "read")
    first = await _send(client, secret, _marketing("ann@example.com"))
    await _send(
        client, secret, {"channel": "email", "to": ["bob@example.com"], "subject": "s", "text": "x"}
    )
    await _send(
        client, secret, {"channel": "sms", "to": ["+15005550006"], "body": "Your code is 1234"}
    )
    await _send(client, secret, _marketing("ann@example.com"))
    await services.sandbox_feedback.drain()

    everything = await _mailbox(client, secret)
    assert [i["to"] for i in everything] == [
        "ann@example.com",
        "+15005550006",
        "bob@example.com",
        "ann@example.com",
    ]  # newest first
    assert [i["to"] for i in await _mailbox(client, secret, channel="sms")] == ["+15005550006"]
    [text] = await _mailbox(client, secret, to="+1 500-555-0006")
    assert (text["body"], text["from"], text["last_event"]) == (
        "Your code is 1234",
        "+15005550006",
        "delivered",
    )
    ann = await _mailbox(client, secret, to="ann@example.com")
    assert len(ann) == 2 and ann[-1]["delivery_id"] == first["deliveries"][0]["id"]
    assert await _mailbox(client, secret, to="nobody@example.com") == []

    # Pages of one, following next_cursor, give the same order.
    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 1, **({"cursor": cursor} if cursor else {})}
        r = await client.get("/v1/sandbox/messages", params=params, headers=bearer(secret))
        assert r.status_code == 200
        seen += [i["id"] for i in r.json()["items"]]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            break
    assert seen == [i["id"] for i in everything]

    for bad in ({"cursor": "not-a-cursor"}, {"limit": 0}, {"channel": "fax"}):
        r = await client.get("/v1/sandbox/messages", params=bad, headers=bearer(secret))
        assert r.status_code == 400, (bad, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    r = await client.get(f"/v1/sandbox/messages/{uuid.uuid4()}", headers=bearer(secret))
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")
    # The scope is `read`: a send-only key may not look.
    only_send = await make_key("send")
    r = await client.get("/v1/sandbox/messages", headers=bearer(only_send))
    assert r.status_code == 403


async def test_eml_download_and_sms_view(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    secret = await make_key("send", "read")
    await _send(client, secret, _marketing("carol@example.com"))
    await _send(client, secret, {"channel": "sms", "to": ["+14155552671"], "body": "Hi Carol"})
    await services.sandbox_feedback.drain()
    [mail] = await _mailbox(client, secret, channel="email")
    [text] = await _mailbox(client, secret, channel="sms")

    r = await client.get(
        f"/v1/sandbox/messages/{mail['id']}", params={"format": "eml"}, headers=bearer(secret)
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("message/rfc822")
    assert r.headers["content-disposition"] == f'attachment; filename="{mail["id"]}.eml"'
    parsed = email.message_from_bytes(r.content, policy=email.policy.default)
    assert parsed["To"] == "carol@example.com"
    assert parsed["Subject"] == "Our autumn news"
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    shown = (await client.get(f"/v1/sandbox/messages/{mail['id']}", headers=bearer(secret))).json()
    assert parsed["List-Unsubscribe"] == shown["list_unsubscribe"]
    assert parsed["X-Gateway-Delivery"] == shown["derived_key"]
    assert shown["eml_url"] == f"/v1/sandbox/messages/{mail['id']}?format=eml"
    assert parsed.get_body(("plain",)).get_content().strip() == "Hello from the newsletter."
    assert "<p>Hello" in parsed.get_body(("html",)).get_content()

    r = await client.get(f"/v1/sandbox/messages/{text['id']}", headers=bearer(secret))
    shown = r.json()
    assert (shown["body"], shown["from"], shown["to"]) == ("Hi Carol", "+15005550006", text["to"])
    assert shown["status_callback"].endswith(f"?d={shown['delivery_id']}")
    assert [c["event"] for c in shown["callbacks"]] == ["sent", "delivered"]
    assert shown["callbacks"][1]["result"] == "applied"
    assert shown["headers"] is None and shown["unsubscribe_url"] is None
    r = await client.get(
        f"/v1/sandbox/messages/{text['id']}", params={"format": "eml"}, headers=bearer(secret)
    )
    assert r.status_code == 400
    assert r.json()["type"] == "urn:problem:eml-email-only"


async def test_real_providers_have_no_mailbox(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    for path in ("/v1/sandbox/messages", f"/v1/sandbox/messages/{uuid.uuid4()}"):
        r = await gw.client.get(path, headers=gw.headers)
        assert r.status_code == 404, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"] == "urn:problem:sandbox-not-configured"


class _FailingOnce:
    """A store that fails its first write (the database was away), then keeps records."""

    def __init__(self) -> None:
        self.calls = 0
        self.rows: dict[uuid.UUID, int] = {}

    async def write(self, new: Any, progressed: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("database away")
        for record in [*new, *progressed]:
            self.rows[record.id] = sum(c.delivered_at is not None for c in record.callbacks)

    async def pending(self) -> list[SandboxRecord]:
        return []


async def test_the_writer_retries_when_the_store_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from sender.providers.sandbox import SandboxEmailProvider
    from tests.sender.test_sandbox import Recorder, _email

    monkeypatch.setattr(FeedbackRunner, "RETRY_SECONDS", 0.0)
    store = _FailingOnce()
    runner = FeedbackRunner(Recorder(), delay=0, store=store)
    await SandboxEmailProvider(runner).send(_email("success@simulator.amazonses.com"))
    await runner.drain()
    assert store.calls >= 2
    assert list(store.rows.values()) == [2]  # both callbacks' progress arrived in the end


# -- kill -9 -----------------------------------------------------------------------------------


@contextlib.contextmanager
def _serving(settings: Settings, **extra: str) -> Any:
    assert settings.database_url is not None
    port = free_port()
    env = clean_env(
        **gateway_env(settings.database_url, settings.redis_url),
        GATEWAY_WORKER_ENABLED="false",
        GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port}",
        GATEWAY_LOG_LEVEL="WARNING",
        **extra,
    )
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port)],
        cwd=Path(settings.data_dir).parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_answering(proc, port)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


async def _status(http: httpx.AsyncClient, secret: str, message_id: str) -> str:
    r = await http.get(f"/v1/messages/{message_id}", headers=bearer(secret))
    assert r.status_code == 200, r.text
    status: str = r.json()["deliveries"][0]["status"]
    return status


async def _statuses(http: httpx.AsyncClient, secret: str, ids: list[str]) -> list[str]:
    return [await _status(http, secret, i) for i in ids]


async def test_pending_callbacks_survive_kill_9(
    settings: Settings, services: Services, make_key: MakeKey
) -> None:
    secret = await make_key("send", "read")
    # Simulated callbacks due 10 and 20 s after the send: the first process is killed
    # before any of them is due.
    with _serving(settings, GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS="10") as (proc, base):
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            ids = []
            for body in (
                {
                    "channel": "email",
                    "to": ["success@simulator.amazonses.com"],
                    "subject": "s",
                    "text": "hi",
                },
                {"channel": "sms", "to": ["+15005550006"], "body": "hi"},
            ):
                r = await http.post(
                    "/v1/messages",
                    json=body,
                    headers={**bearer(secret), "Idempotency-Key": f'"{uuid.uuid4()}"'},
                )
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
            r = await http.get("/v1/sandbox/messages", headers=bearer(secret))
            assert [i["callbacks_pending"] for i in r.json()["items"]] == [2, 2]
            assert await _statuses(http, secret, ids) == ["sent", "sent"]
        proc.kill()  # SIGKILL: nothing runs on the way out
        proc.wait()

    assert services.sandbox_mailbox is not None
    pending = await services.sandbox_mailbox.mailbox.pending()
    assert sorted(r.channel for r in pending) == ["email", "sms"]

    # A new process replays them at start, each when due.
    with _serving(settings) as (_, base):
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            deadline = time.monotonic() + 120  # a guard against hanging, not a timing assertion
            while (now := await _statuses(http, secret, ids)) != ["delivered", "delivered"]:
                assert time.monotonic() < deadline, now
                await asyncio.sleep(0.5)
            r = await http.get("/v1/sandbox/messages", headers=bearer(secret))
            items = r.json()["items"]
            assert [i["last_event"] for i in items] == ["delivered", "Delivery"]
            assert [i["callbacks_pending"] for i in items] == [0, 0]
