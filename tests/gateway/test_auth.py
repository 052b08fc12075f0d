"""API key authentication and scopes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

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
