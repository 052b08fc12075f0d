"""SSRF guard: only https URLs to public addresses, checked at creation and at connection."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

import httpx
import pytest

from gateway.services import Services
from tests.conftest import bearer, replace_settings
from tests.webhooks.outbound.receiver import Receiver
from webhooks.outbound import store
from webhooks.outbound.ssrf import UnsafeUrl, address_problem, parse_url, resolve_public

from .conftest import pushing


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.1.2.3",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",  # AWS, GCP, Azure, ... instance metadata
        "169.254.170.2",  # ECS task metadata
        "100.100.100.200",  # Alibaba metadata
        "168.63.129.16",  # Azure wire server
        "100.64.0.1",  # shared address space (carrier NAT)
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",  # AWS metadata over IPv6
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2001:db8::1",  # documentation
    ],
)
def test_forbidden_addresses(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808"]
)
def test_public_addresses(address: str) -> None:
    assert address_problem(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com/hook", "https"),
        ("ftp://example.com/hook", "https"),
        ("https:///hook", "no host"),
        ("https://user:pw@example.com/hook", "user name"),
        ("https://example.com:99999/hook", "valid URL"),
        ("https://example.com/hook#x", "fragment"),
        ("https://example.com/" + "a" * 2000, "longer"),
    ],
)
def test_urls_refused_before_any_resolution(url: str, why: str) -> None:
    with pytest.raises(UnsafeUrl, match=why):
        parse_url(url, allow_private=False)


def test_the_development_flag_allows_http() -> None:
    assert parse_url("http://localhost:8080/x", allow_private=True) == ("localhost", 8080)


async def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    with pytest.raises(UnsafeUrl, match="loopback"):
        await resolve_public("https://localhost/hook", allow_private=False, time_limit=5)
    target = await resolve_public("https://localhost/hook", allow_private=True, time_limit=5)
    assert target.host == "localhost" and target.port == 443 and target.addresses


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    """Production rules: no private addresses (the CA is still trusted)."""
    import dataclasses

    return replace_settings(
        settings, outbound=dataclasses.replace(settings.outbound, allow_private=False)
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://169.254.169.254/latest/meta-data/",
        "https://[fd00:ec2::254]/latest",
        "https://[::ffff:127.0.0.1]:8443/hook",
        "https://localhost/hook",
        "https://10.1.2.3/hook",
        "http://93.184.215.14/hook",  # public, but not https
    ],
)
async def test_creating_an_endpoint_for_a_forbidden_url_is_a_422(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]], url: str
) -> None:
    admin = await make_key("admin")
    answer = await client.post(
        "/v1/webhook-endpoints", json={"url": url, "events": ["*"]}, headers=bearer(admin)
    )
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["type"] == "urn:problem:invalid-endpoint"
    listed = await client.get("/v1/webhook-endpoints", headers=bearer(admin))
    assert listed.json() == []


async def test_a_public_address_is_accepted(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    admin = await make_key("admin")
    answer = await client.post(
        "/v1/webhook-endpoints",
        json={"url": "https://93.184.215.14/hook", "events": ["*"]},
        headers=bearer(admin),
    )
    assert answer.status_code == 201, answer.text


async def test_changing_the_url_to_a_forbidden_one_is_a_422_that_changes_nothing(
    client: httpx.AsyncClient, make_key: Callable[..., Awaitable[str]]
) -> None:
    admin = await make_key("admin")
    created = await client.post(
        "/v1/webhook-endpoints",
        json={"url": "https://93.184.215.14/hook", "events": ["*"]},
        headers=bearer(admin),
    )
    endpoint = created.json()
    answer = await client.patch(
        f"/v1/webhook-endpoints/{endpoint['id']}",
        json={"url": "https://169.254.169.254/"},
        headers=bearer(admin),
    )
    assert answer.status_code == 422
    shown = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    assert shown.json()["url"] == "https://93.184.215.14/hook"


async def test_every_connection_is_checked_again(
    services: Services, receiver: Receiver, make_key: Callable[..., Awaitable[str]]
) -> None:
    """An endpoint stored while local addresses were allowed (or whose name later resolves
    inside) is refused at connection time: nothing reaches the receiver."""
    import dataclasses
    import uuid

    from suppression.db import pg_connection

    admin_id = uuid.uuid4()
    async with pg_connection(services.engine) as conn:
        endpoint = await store.create_endpoint(
            conn,
            url=receiver.url(),
            description="",
            events=["*"],
            api_key_id=admin_id,
            secret_encrypted=services.protector.encrypt("whsec_" + "A" * 44),
            feed_cursor=None,
            now=services.outbound.pusher.now(),
        )
        await store.add_deliveries(
            conn,
            endpoint.id,
            [store.NewDelivery("evt_1", "delivery.sent", endpoint.created_at, '{"id":"evt_1"}')],
            now=endpoint.created_at,
        )
    strict = dataclasses.replace(services.settings.outbound, allow_private=False)
    async with pushing(services, settings=strict) as worker:
        await worker.drain()
    assert receiver.requests == []
    async with pg_connection(services.engine) as conn:
        (attempt, *_) = await store.list_attempts(conn, endpoint.id, limit=10)
    assert attempt.status_code is None and attempt.error is not None
    assert attempt.error.startswith("refused:") and "loopback" in attempt.error
