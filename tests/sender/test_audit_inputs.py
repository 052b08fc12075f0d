"""Audit: nothing a client sends to the send API produces a 500 (DESIGN: bad input gets a
4xx problem document), and a refused request stores nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sender.helpers import Gateway, count_rows

_EMAIL = {"channel": "email", "subject": "s", "text": "t"}
_SMS = {"channel": "sms", "body": "b"}

BAD_BODIES: list[tuple[str, Any]] = [
    ("array", [1, 2]),
    ("string", "hello"),
    ("null", None),
    ("no channel", {"to": ["a@example.com"], "subject": "s", "text": "t"}),
    ("bad channel", {**_EMAIL, "channel": "fax", "to": ["a@example.com"]}),
    ("empty to", {**_EMAIL, "to": []}),
    ("101 recipients", {**_EMAIL, "to": [f"u{i}@example.com" for i in range(101)]}),
    ("to not a list", {**_EMAIL, "to": "a@example.com"}),
    ("to of numbers", {**_EMAIL, "to": [12345]}),
    ("overlong address", {**_EMAIL, "to": ["x" * 400 + "@example.com"]}),
    ("no at", {**_EMAIL, "to": ["nobody"]}),
    ("double at", {**_EMAIL, "to": ["a@@example.com"]}),
    ("nul in address", {**_EMAIL, "to": ["a\u0000b@example.com"]}),
    ("ip literal", {**_EMAIL, "to": ["user@[127.0.0.1]"]}),
    ("bad idna", {**_EMAIL, "to": ["user@xn--.com"]}),
    ("long label", {**_EMAIL, "to": ["user@" + "a" * 70 + ".com"]}),
    ("sms short", {**_SMS, "to": ["+1"]}),
    ("sms letters", {**_SMS, "to": ["call me"]}),
    ("sms too long", {**_SMS, "to": ["+9999999999999999999999"]}),
    ("sms email", {**_SMS, "to": ["a@example.com"]}),
    ("email to a number", {**_EMAIL, "to": ["+15005550006"]}),
    ("bad priority", {**_EMAIL, "to": ["a@example.com"], "priority": "urgent"}),
    ("bad category", {**_EMAIL, "to": ["a@example.com"], "category": "bulk"}),
    ("expires garbage", {**_EMAIL, "to": ["a@example.com"], "expires_at": "soon"}),
    ("expires naive", {**_EMAIL, "to": ["a@example.com"], "expires_at": "2999-01-01T00:00:00"}),
    ("expires past", {**_EMAIL, "to": ["a@example.com"], "expires_at": "2001-01-01T00:00:00Z"}),
    ("expires year 1", {**_EMAIL, "to": ["a@example.com"], "expires_at": "0001-01-01T00:00:00Z"}),
    # Valid RFC 3339, but UTC cannot represent it (the driver would fail on it).
    (
        "expires beyond utc",
        {**_EMAIL, "to": ["a@example.com"], "expires_at": "9999-12-31T23:59:59-14:00"},
    ),
    ("metadata not strings", {**_EMAIL, "to": ["a@example.com"], "metadata": {"a": 1}}),
    ("metadata nested", {**_EMAIL, "to": ["a@example.com"], "metadata": {"a": {"b": "c"}}}),
    ("metadata empty key", {**_EMAIL, "to": ["a@example.com"], "metadata": {"": "x"}}),
    ("unknown field", {**_EMAIL, "to": ["a@example.com"], "cc": ["b@example.com"]}),
    ("bad from", {**_EMAIL, "to": ["a@example.com"], "from": "Name <not an address>"}),
    ("bad reply_to", {**_EMAIL, "to": ["a@example.com"], "reply_to": ["x"]}),
    ("reply_to number", {**_EMAIL, "to": ["a@example.com"], "reply_to": 5}),
    ("email without content", {"channel": "email", "to": ["a@example.com"], "subject": "s"}),
    ("sms with subject", {**_SMS, "to": ["+15005550006"], "subject": "s"}),
    ("sms body too long", {**_SMS, "to": ["+15005550006"], "body": "x" * 2000}),
    ("empty topic", {**_EMAIL, "to": ["a@example.com"], "topic": ""}),
]


@pytest.mark.parametrize(("name", "body"), BAD_BODIES, ids=[n for n, _ in BAD_BODIES])
async def test_bad_send_bodies_get_a_4xx_problem_and_store_nothing(
    providers_gateway: Gateway, name: str, body: Any
) -> None:
    response = await providers_gateway.send(body)
    assert response.status_code in (400, 422), (name, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert await count_rows(providers_gateway.services) == {
        "messages": 0,
        "deliveries": 0,
        "attempts": 0,
    }


RAW_BODIES: list[tuple[str, bytes]] = [
    ("not json", b"not json"),
    ("truncated", b'{"channel": "email", "to": ["a@example.com"'),
    ("not utf-8", b'{"channel": "email", "to": ["\xff@example.com"], "subject": "s", "text": "t"}'),
    ("lone surrogate", b'{"channel": "email", "to": ["a@example.com"], "subject": "\\ud800"}'),
    ("nan", b'{"channel": "email", "to": ["a@example.com"], "subject": NaN}'),
    ("empty", b""),
]


@pytest.mark.parametrize(("name", "raw"), RAW_BODIES, ids=[n for n, _ in RAW_BODIES])
async def test_malformed_raw_bodies_get_400(
    providers_gateway: Gateway, name: str, raw: bytes
) -> None:
    gw = providers_gateway
    headers = {**gw.headers, "Idempotency-Key": '"k-1"', "Content-Type": "application/json"}
    response = await gw.client.post("/v1/messages", content=raw, headers=headers)
    assert response.status_code == 400, (name, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert (await count_rows(gw.services))["messages"] == 0


@pytest.mark.parametrize(
    "key",
    [
        '"caf\u00e9"'.encode("latin-1"),  # not ASCII
        b"a b",
        b'"unterminated',
        b'"x" y',
        b'""',
        b'"bad \\n escape"',
        b"k" * 300,
    ],
)
async def test_bad_idempotency_keys_are_400_before_anything_is_stored(
    providers_gateway: Gateway, key: bytes
) -> None:
    gw = providers_gateway
    body = {**_EMAIL, "to": ["a@example.com"]}
    headers = [(k.encode(), v.encode()) for k, v in gw.headers.items()]
    headers.append((b"Idempotency-Key", key))
    response = await gw.client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 400, (key, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert (await count_rows(gw.services))["messages"] == 0
