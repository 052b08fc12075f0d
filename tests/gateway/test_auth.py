"""API key authentication and scopes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest
from sqlalchemy import text

from gateway.keycache import KeyCache, Lookup, database_lookup
from gateway.keys import Principal, hash_secret
from gateway.services import Services
from tests.conftest import bearer

Client = httpx.AsyncClient


async def test_missing_key_is_401_problem(client: Client) -> None:
    response = await client.get("/v1/keys")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["www-authenticate"].startswith("Bearer")
    body = response.json()
    assert body["status"] == 401 and body["title"] == "Unauthorized"


async def test_unknown_key_is_401(client: Client) -> None:
    response = await client.get("/v1/keys", headers=bearer("gw_not-a-real-key"))
    assert response.status_code == 401


async def test_malformed_authorization_header_is_401(client: Client) -> None:
    response = await client.get("/v1/keys", headers={"Authorization": "Basic Zm9vOmJhcg=="})
    assert response.status_code == 401


async def test_wrong_scope_is_403(client: Client, make_key: Callable[..., Awaitable[str]]) -> None:
    secret = await make_key("send", "read")
    response = await client.get("/v1/keys", headers=bearer(secret))
    assert response.status_code == 403
    assert "admin" in response.json()["detail"]


async def test_right_scope_is_200(client: Client, make_key: Callable[..., Awaitable[str]]) -> None:
    secret = await make_key("admin")
    response = await client.get("/v1/keys", headers=bearer(secret))
    assert response.status_code == 200
    assert [k["scopes"] for k in response.json()] == [["admin"]]
    assert "secret" not in response.json()[0]


async def test_revoked_key_is_401(client: Client, make_key: Callable[..., Awaitable[str]]) -> None:
    admin = await make_key("admin")
    other = await make_key("read")
    keys = (await client.get("/v1/keys", headers=bearer(admin))).json()
    other_id = next(k["id"] for k in keys if k["scopes"] == ["read"])
    assert (await client.delete(f"/v1/keys/{other_id}", headers=bearer(admin))).status_code == 204
    assert (await client.get("/v1/keys", headers=bearer(other))).status_code == 401
    response = await client.post("/v1/keys", json={"scopes": ["read"]}, headers=bearer(other))
    assert response.status_code == 401


async def test_created_key_secret_is_shown_once_and_stored_hashed(
    client: Client, make_key: Callable[..., Awaitable[str]], services: object
) -> None:
    from sqlalchemy import text

    from gateway.services import Services

    assert isinstance(services, Services)
    admin = await make_key("admin")
    created = await client.post(
        "/v1/keys", json={"scopes": ["send"], "name": "svc"}, headers=bearer(admin)
    )
    assert created.status_code == 201
    secret = created.json()["secret"]
    assert secret.startswith("gw_")
    async with services.engine.connect() as conn:
        dump = (await conn.execute(text("SELECT api_keys::text FROM api_keys"))).scalars().all()
    assert not any(secret in row for row in dump)
    # the new key works for its scope
    assert (await client.get("/v1/keys", headers=bearer(secret))).status_code == 403


async def test_unknown_scope_is_422(
    client: Client, make_key: Callable[..., Awaitable[str]]
) -> None:
    admin = await make_key("admin")
    response = await client.post("/v1/keys", json={"scopes": ["root"]}, headers=bearer(admin))
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")


# -- the key cache ---------------------------------------------------------------------------


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _counting(services: Services) -> tuple[list[str], Lookup]:
    """The real database look-up, recording each hash it is asked for."""
    asked: list[str] = []
    real = database_lookup(services.engine)

    async def lookup(secret_hash: str) -> Principal | None:
        asked.append(secret_hash)
        return await real(secret_hash)

    return asked, lookup


async def test_known_and_unknown_keys_are_looked_up_once_per_ttl(
    client: Client, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    clock = FakeClock()
    asked, lookup = _counting(services)
    services.api_keys = KeyCache(lookup, ttl=5.0, clock=clock)
    admin = await make_key("admin")
    for _ in range(3):
        assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200
        assert (await client.get("/v1/keys", headers=bearer("gw_nope"))).status_code == 401
    assert len(asked) == 2
    clock.now += 5.0
    assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200
    assert (await client.get("/v1/keys", headers=bearer("gw_nope"))).status_code == 401
    assert len(asked) == 4


async def test_revocation_through_the_api_applies_to_the_next_request(
    client: Client, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    services.api_keys = KeyCache(database_lookup(services.engine), ttl=3600.0)
    admin = await make_key("admin")
    other = await make_key("read", name="other")
    # both cached (for an hour: only the revocation can drop `other`)
    assert (await client.get("/v1/keys", headers=bearer(other))).status_code == 403
    keys = (await client.get("/v1/keys", headers=bearer(admin))).json()
    other_id = next(k["id"] for k in keys if k["name"] == "other")
    assert (await client.delete(f"/v1/keys/{other_id}", headers=bearer(admin))).status_code == 204
    assert (await client.get("/v1/keys", headers=bearer(other))).status_code == 401
    assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200


async def test_revocation_by_another_process_applies_within_the_ttl(
    client: Client, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    clock = FakeClock()
    services.api_keys = KeyCache(database_lookup(services.engine), ttl=5.0, clock=clock)
    admin = await make_key("admin")
    assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200
    # `gateway keys revoke` (or another worker) writes the database, not this process's cache
    async with services.engine.begin() as conn:
        await conn.execute(text("UPDATE api_keys SET revoked_at = now()"))
    clock.now += 4.9
    assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200
    clock.now += 0.1
    assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 401


async def test_cache_disabled_with_ttl_zero(
    client: Client, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    asked, lookup = _counting(services)
    services.api_keys = KeyCache(lookup, ttl=0.0)
    admin = await make_key("admin")
    for _ in range(2):
        assert (await client.get("/v1/keys", headers=bearer(admin))).status_code == 200
        assert (await client.get("/v1/keys", headers=bearer("gw_nope"))).status_code == 401
    assert len(asked) == 4 and len(services.api_keys) == 0


PRINCIPAL = Principal(key_id=uuid.uuid4(), name="k", scopes=frozenset({"read"}))


async def test_random_bad_keys_cannot_grow_the_cache_or_evict_good_ones() -> None:
    asked: list[str] = []

    async def lookup(secret_hash: str) -> Principal | None:
        asked.append(secret_hash)
        return PRINCIPAL if secret_hash == hash_secret("good") else None

    cache = KeyCache(lookup, max_keys=10, max_unknown=3)
    assert await cache.principal("good") == PRINCIPAL
    for i in range(100):
        assert await cache.principal(f"bad{i}") is None
    assert len(cache) == 1 + 3
    assert await cache.principal("good") == PRINCIPAL
    assert asked.count(hash_secret("good")) == 1
    # the most recent bad keys are remembered, older ones asked again
    assert await cache.principal("bad99") is None
    assert await cache.principal("bad0") is None
    assert len(asked) == 1 + 100 + 1


async def test_concurrent_misses_share_one_lookup() -> None:
    calls = 0
    gate = asyncio.Event()

    async def lookup(secret_hash: str) -> Principal | None:
        nonlocal calls
        calls += 1
        await gate.wait()
        return PRINCIPAL

    cache = KeyCache(lookup)
    waiters = [asyncio.ensure_future(cache.principal("k")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*waiters) == [PRINCIPAL] * 5
    assert calls == 1


async def test_a_lookup_racing_a_revocation_is_not_cached() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    answers = [PRINCIPAL, None]

    async def lookup(secret_hash: str) -> Principal | None:
        started.set()
        await release.wait()
        return answers.pop(0)

    cache = KeyCache(lookup, ttl=3600.0)
    racing = asyncio.ensure_future(cache.principal("k"))
    await started.wait()
    cache.forget(PRINCIPAL.key_id)  # committed while the look-up read the old row
    release.set()
    assert await racing == PRINCIPAL  # that request raced the revocation
    assert await cache.principal("k") is None  # the next one does not reuse its answer


async def test_a_failing_lookup_is_not_cached() -> None:
    answers: list[Principal | Exception] = [OSError("database down"), PRINCIPAL]

    async def lookup(secret_hash: str) -> Principal | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    cache = KeyCache(lookup)
    with pytest.raises(OSError, match="database down"):
        await cache.principal("k")
    assert await cache.principal("k") == PRINCIPAL
