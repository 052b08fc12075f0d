"""Pushes: Standard Webhooks signatures, retries with the same webhook-id, rotation, the
failure window, the attempts list, replay, concurrency between workers and endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from gateway.services import Services
from tests.conftest import bearer
from tests.sender.helpers import email
from tests.webhooks.outbound.receiver import HANG, Receiver

from .conftest import Clock, pushing
from .helpers import create_endpoint, queue_event

MakeKey = Callable[..., Awaitable[str]]


async def test_the_answer_carries_the_secret_once_and_it_is_stored_encrypted(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver, description="orders")
    assert endpoint["secret"].startswith("whsec_")
    Webhook(endpoint["secret"])  # a secret every Standard Webhooks verifier takes
    assert endpoint["enabled"] is True and endpoint["disabled_reason"] is None
    shown = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    assert "secret" not in shown.json()
    listed = await client.get("/v1/webhook-endpoints", headers=bearer(admin))
    assert [e["id"] for e in listed.json()] == [endpoint["id"]]
    assert endpoint["secret"] not in listed.text
    async with services.engine.connect() as conn:
        stored = (
            await conn.exec_driver_sql("SELECT secret_encrypted FROM webhook_endpoints")
        ).all()
    assert endpoint["secret"] not in stored[0][0]
    assert services.protector.decrypt(stored[0][0]) == endpoint["secret"]


async def test_api_key_id_defaults_to_the_creating_key_and_must_be_active(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    principal = await services.api_keys.principal(admin)
    assert principal is not None and endpoint["api_key_id"] == str(principal.key_id)
    answer = await client.post(
        "/v1/webhook-endpoints",
        json={
            "url": receiver.url(),
            "events": ["delivery.bounced"],
            "api_key_id": "00000000-0000-4000-8000-000000000000",
        },
        headers=bearer(admin),
    )
    assert answer.status_code == 422 and "api_key_id" in answer.json()["detail"]


async def test_only_admin_keys_manage_endpoints(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver
) -> None:
    reader = await make_key("read", "send")
    answer = await client.post(
        "/v1/webhook-endpoints",
        json={"url": receiver.url(), "events": ["*"]},
        headers=bearer(reader),
    )
    assert answer.status_code == 403
    assert (await client.get("/v1/webhook-endpoints")).status_code == 401


async def test_unknown_event_types_are_a_422(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver
) -> None:
    admin = await make_key("admin")
    for events in (["delivery.exploded"], []):
        answer = await client.post(
            "/v1/webhook-endpoints",
            json={"url": receiver.url(), "events": events},
            headers=bearer(admin),
        )
        assert answer.status_code == 422, answer.text


async def test_test_sends_a_signed_ping(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    answer = await client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=bearer(admin)
    )
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["delivered"] is True and result["status_code"] == 200
    (got,) = receiver.requests
    assert got.verified_by == [endpoint["secret"]]
    assert got.webhook_id == result["event_id"] == got.event["id"]
    assert got.event["type"] == "ping"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["host"] == f"localhost:{receiver.port}"
    # the signature, by hand from the spec's definition, through the package's signer
    timestamp = got.headers["webhook-timestamp"]
    assert timestamp.isdigit()
    assert got.signatures[0].startswith("v1,")


async def test_a_failed_ping_is_not_retried(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    receiver.default_status = 503
    answer = await client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=bearer(admin)
    )
    result = answer.json()
    assert result["delivered"] is False and result["status_code"] == 503
    assert result["error"] == "HTTP 503"
    async with pushing(services) as worker:
        assert await worker.drain() == 0
    assert len(receiver.requests) == 1
    shown = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    assert shown.json()["failing_since"] is None  # a test says nothing about health


async def test_500_twice_then_200_gets_the_same_webhook_id_three_times(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver, events=["delivery.sent"])
    sent = await client.post(
        "/v1/messages",
        json=email("success@simulator.amazonses.com"),
        headers={**bearer(admin), "Idempotency-Key": '"three-tries"'},
    )
    assert sent.status_code == 201, sent.text
    receiver.script.extend([500, 500, 200])
    async with pushing(services) as worker:
        assert await worker.drain() == 3
    event_id = receiver.requests[0].webhook_id
    assert receiver.requests[0].event["type"] == "delivery.sent"
    assert [r.webhook_id for r in receiver.requests] == [event_id] * 3
    assert all(r.verified_by == [endpoint["secret"]] for r in receiver.requests)
    assert len({r.body for r in receiver.requests}) == 1
    attempts = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}/attempts", headers=bearer(admin))
    ).json()
    assert [a["status_code"] for a in attempts] == [200, 500, 500]  # newest first
    assert [a["error"] for a in attempts] == [None, "HTTP 500", "HTTP 500"]
    assert all(a["event_id"] == event_id and a["latency_ms"] >= 0 for a in attempts)
    assert {a["delivery_status"] for a in attempts} == {"delivered"}
    shown = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    assert shown.json()["failing_since"] is None


async def test_after_the_schedule_the_event_is_failed_for_that_endpoint(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    await queue_event(services, endpoint["id"])
    receiver.default_status = 500
    async with pushing(services) as worker:
        # the first try and the schedule's two retries
        assert await worker.drain() == 3
        assert await worker.drain() == 0
    attempts = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}/attempts", headers=bearer(admin))
    ).json()
    assert len(attempts) == 3 and {a["delivery_status"] for a in attempts} == {"failed"}
    shown = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    ).json()
    assert shown["failing_since"] is not None and shown["enabled"] is True


async def test_retries_wait_for_the_schedule(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    event_id = await queue_event(services, endpoint["id"])
    receiver.script.extend([500, 500])
    clock = Clock()
    schedule = dataclasses.replace(services.settings.outbound, retry_schedule=(5.0, 300.0))
    async with pushing(services, clock=clock, settings=schedule) as worker:
        assert await worker.drain() == 1
        clock.advance(seconds=4)
        assert await worker.drain() == 0
        clock.advance(seconds=1)
        assert await worker.drain() == 1
        clock.advance(seconds=299)
        assert await worker.drain() == 0
        clock.advance(seconds=1)
        assert await worker.drain() == 1
    assert [r.webhook_id for r in receiver.requests] == [event_id] * 3


async def test_rotation_signs_with_both_secrets_for_24_hours(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    old = endpoint["secret"]
    rotated = await client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", headers=bearer(admin)
    )
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != old
    assert rotated.json()["previous_secret_expires_at"] is not None
    receiver.secrets.append(new)

    clock = Clock()
    async with pushing(services, clock=clock) as worker:
        await queue_event(services, endpoint["id"])
        await worker.drain()
        (first,) = receiver.requests
        assert len(first.signatures) == 2
        assert set(first.verified_by) == {old, new}
        # each signature alone verifies with its own secret
        for signature, secret in zip(first.signatures, (new, old), strict=True):
            alone = {**first.headers, "webhook-signature": signature}
            Webhook(secret).verify(first.body, alone)

        clock.advance(hours=24, seconds=1)
        await queue_event(services, endpoint["id"])
        await worker.drain()
    second = receiver.requests[1]
    assert len(second.signatures) == 1 and second.verified_by == [new]


async def test_an_endpoint_failing_for_the_window_is_disabled_and_says_so(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    receiver.default_status = 502
    clock = Clock()
    started = clock.now
    async with pushing(services, clock=clock) as worker:
        await queue_event(services, endpoint["id"])
        await worker.drain()
        clock.advance(days=4, hours=23)
        await queue_event(services, endpoint["id"])
        await worker.drain()
        shown = await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
        assert shown.json()["enabled"] is True
        clock.advance(hours=1)
        await queue_event(services, endpoint["id"])
        await worker.drain()
        tries = len(receiver.requests)
        # disabled: a new event is not pushed
        await queue_event(services, endpoint["id"])
        await worker.drain()
        assert len(receiver.requests) == tries
    shown = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    ).json()
    assert shown["enabled"] is False and shown["disabled_reason"] == "failing"
    assert shown["disabled_since"] is not None
    assert shown["failing_since"].startswith(started.date().isoformat())


async def test_a_success_inside_the_window_keeps_the_endpoint(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    clock = Clock()
    async with pushing(services, clock=clock) as worker:
        receiver.default_status = 500
        await queue_event(services, endpoint["id"])
        await worker.drain()
        clock.advance(days=3)
        receiver.default_status = 204
        await queue_event(services, endpoint["id"])
        await worker.drain()
        clock.advance(days=3)
        receiver.default_status = 500
        await queue_event(services, endpoint["id"])
        await worker.drain()
    shown = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}", headers=bearer(admin))
    ).json()
    assert shown["enabled"] is True and shown["failing_since"] is not None


async def test_disable_and_enable_by_patch(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    url = f"/v1/webhook-endpoints/{endpoint['id']}"
    off = await client.patch(url, json={"enabled": False}, headers=bearer(admin))
    assert off.status_code == 200
    assert off.json()["enabled"] is False and off.json()["disabled_reason"] == "operator"
    await queue_event(services, endpoint["id"])
    async with pushing(services) as worker:
        assert await worker.drain() == 0
        on = await client.patch(
            url, json={"enabled": True, "events": ["delivery.bounced"]}, headers=bearer(admin)
        )
        assert on.json()["enabled"] is True and on.json()["disabled_reason"] is None
        assert on.json()["events"] == ["delivery.bounced"]
        assert await worker.drain() == 1  # what waited while disabled goes out now
    assert (await client.delete(url, headers=bearer(admin))).status_code == 204
    assert (await client.get(url, headers=bearer(admin))).status_code == 404
    assert (await client.patch(url, json={}, headers=bearer(admin))).status_code == 404


async def test_replay_sends_again_with_the_same_webhook_id(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    clock = Clock()
    async with pushing(services, clock=clock) as worker:
        early = await queue_event(services, endpoint["id"], occurred_at=clock.now)
        late = await queue_event(
            services, endpoint["id"], occurred_at=clock.now + dt.timedelta(minutes=10)
        )
        await worker.drain()
        assert {r.webhook_id for r in receiver.requests} == {early, late}
        since = (clock.now + dt.timedelta(minutes=5)).isoformat()
        answer = await client.post(
            f"/v1/webhook-endpoints/{endpoint['id']}/replay",
            json={"since": since},
            headers=bearer(admin),
        )
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"replayed": 1, "next_since": None}
        await worker.drain()
    assert [r.webhook_id for r in receiver.requests[2:]] == [late]
    (first_late,) = [r for r in receiver.requests[:2] if r.webhook_id == late]
    assert receiver.requests[2].body == first_late.body


async def test_two_workers_push_each_event_once(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    ids = {await queue_event(services, endpoint["id"]) for _ in range(40)}
    async with pushing(services) as one, pushing(services) as two:
        await asyncio.gather(one.drain(), two.drain())
    got = [r.webhook_id for r in receiver.requests]
    assert sorted(got) == sorted(ids)


async def test_a_hanging_endpoint_does_not_hold_another(
    client: httpx.AsyncClient,
    make_key: MakeKey,
    receiver: Receiver,
    services: Services,
    tls_files: tuple,  # type: ignore[type-arg]
) -> None:
    admin = await make_key("admin")
    with Receiver((tls_files[1], tls_files[2])) as slow:
        slow_endpoint = await create_endpoint(client, admin, slow)
        fast_endpoint = await create_endpoint(client, admin, receiver)
        slow.script.extend([HANG] * 10)
        for _ in range(10):
            await queue_event(services, slow_endpoint["id"])
        fast_ids = [await queue_event(services, fast_endpoint["id"]) for _ in range(5)]
        async with pushing(services) as worker:
            run = asyncio.create_task(worker.run())
            try:
                await asyncio.to_thread(receiver.wait_for, 5)
                # the slow endpoint holds no more than its own share of the tries
                assert len(slow.requests) <= services.settings.outbound.endpoint_concurrency
                assert not slow.release.is_set()
            finally:
                slow.release.set()
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
    assert sorted(r.webhook_id for r in receiver.requests) == sorted(fast_ids)


async def test_a_key_rotation_reencrypts_the_signing_secrets(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    from cryptography.fernet import Fernet

    from gateway.subjects import rotate_encryption
    from suppression.crypto import AddressProtector
    from tests.conftest import TEST_FERNET_KEYS, TEST_HASH_KEY

    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    rotated = await client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret", headers=bearer(admin)
    )
    newest = Fernet.generate_key().decode()
    report = await rotate_encryption(
        services.sessions, AddressProtector(TEST_HASH_KEY, (newest, *TEST_FERNET_KEYS))
    )
    assert report.rotated["webhook_endpoints.secret_encrypted"] == 1
    assert report.rotated["webhook_endpoints.previous_secret_encrypted"] == 1
    only_newest = AddressProtector(TEST_HASH_KEY, (newest,))
    async with services.engine.connect() as conn:
        (current, previous), *_ = (
            await conn.exec_driver_sql(
                "SELECT secret_encrypted, previous_secret_encrypted FROM webhook_endpoints"
            )
        ).all()
    assert only_newest.decrypt(current) == rotated.json()["secret"]
    assert only_newest.decrypt(previous) == endpoint["secret"]


async def test_an_endpoint_deleted_during_a_push_is_no_error(
    client: httpx.AsyncClient,
    make_key: MakeKey,
    receiver: Receiver,
    services: Services,
    caplog: pytest.LogCaptureFixture,
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    await queue_event(services, endpoint["id"])
    receiver.script.append(HANG)
    async with pushing(services) as worker:
        pushing_now = asyncio.create_task(worker.drain())
        await asyncio.to_thread(receiver.wait_for, 1)
        url = f"/v1/webhook-endpoints/{endpoint['id']}"
        assert (await client.delete(url, headers=bearer(admin))).status_code == 204
        receiver.release.set()
        assert await pushing_now == 1
    async with services.engine.connect() as conn:
        left = (await conn.exec_driver_sql("SELECT count(*) FROM webhook_attempts")).scalar()
    assert left == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_certificate_the_client_does_not_trust_fails_the_try(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    system_trust = dataclasses.replace(services.settings.outbound, ca_bundle=None)
    await queue_event(services, endpoint["id"])
    async with pushing(services, settings=system_trust) as worker:
        await worker.drain()
    assert receiver.requests == []
    attempts = (
        await client.get(f"/v1/webhook-endpoints/{endpoint['id']}/attempts", headers=bearer(admin))
    ).json()
    assert len(attempts) == 3 and all(a["status_code"] is None for a in attempts)
    assert "CERTIFICATE_VERIFY_FAILED" in attempts[0]["error"]


async def test_a_secret_no_configured_key_can_read_fails_the_try_not_the_request(
    client: httpx.AsyncClient, make_key: MakeKey, receiver: Receiver, services: Services
) -> None:
    from cryptography.fernet import Fernet

    admin = await make_key("admin")
    endpoint = await create_endpoint(client, admin, receiver)
    lost = Fernet(Fernet.generate_key()).encrypt(endpoint["secret"].encode()).decode()
    async with services.engine.begin() as conn:
        await conn.exec_driver_sql("UPDATE webhook_endpoints SET secret_encrypted = $1", (lost,))
    answer = await client.post(
        f"/v1/webhook-endpoints/{endpoint['id']}/test", headers=bearer(admin)
    )
    assert answer.status_code == 200
    assert answer.json()["delivered"] is False
    assert "cannot be decrypted" in answer.json()["error"]
    assert receiver.requests == []
