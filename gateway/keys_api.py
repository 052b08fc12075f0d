"""Operator API for API keys (scope `admin`)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Annotated

import msgspec
from litestar import Controller, delete, get, post
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.keys import (
    MAX_KEY_NAME,
    SCOPES,
    UnknownScopeError,
    create_key,
    list_keys,
    parse_scopes,
    revoke_key,
)
from gateway.services import Services

MAX_SCOPES = 16
MAX_SCOPE = 32


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Request body of `POST /v1/keys`: the key's scopes and a name for operators (one line)."""

    # Checked by `parse_scopes` (422 otherwise).
    scopes: Annotated[
        list[Annotated[str, msgspec.Meta(max_length=MAX_SCOPE)]],
        msgspec.Meta(max_length=MAX_SCOPES),
        Parameter(
            min_items=1, schema_extra={"items": Schema(type=OpenAPIType.STRING, enum=list(SCOPES))}
        ),
    ]
    name: Annotated[str, msgspec.Meta(max_length=MAX_KEY_NAME)] = ""


@dataclass
class KeyView:
    """An API key as operators see it (never the secret)."""

    id: uuid.UUID
    name: str
    scopes: list[str]
    created_at: dt.datetime
    revoked_at: dt.datetime | None


@dataclass
class KeyCreated(KeyView):
    """The one response that carries the secret."""

    secret: str = ""


class KeysController(Controller):
    """Create, list and revoke API keys."""

    path = "/v1/keys"
    tags = ["keys"]
    opt = {"scope": "admin"}

    @post(
        "/",
        summary="Create an API key (the secret is returned once)",
        responses={422: ResponseSpec(None, description="No scopes, or an unknown one")},
    )
    async def create(self, data: KeyCreate, db_session: AsyncSession) -> KeyCreated:
        """Create a key with the given scopes."""
        try:
            # The API takes scope names exactly as documented (the CLI's comma-separated
            # list may have blanks around them).
            unknown = [s for s in data.scopes if s not in SCOPES]
            if unknown:
                raise UnknownScopeError(
                    f"unknown scope(s) {', '.join(map(repr, unknown))}; "
                    f"choose from {', '.join(SCOPES)}"
                )
            scopes = parse_scopes(data.scopes)
        except UnknownScopeError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        row, secret = await create_key(db_session, scopes, name=data.name)
        await db_session.commit()
        return KeyCreated(row.id, row.name, row.scopes, row.created_at, row.revoked_at, secret)

    @get("/", summary="List API keys")
    async def list(self, db_session: AsyncSession) -> list[KeyView]:
        """Every key, revoked ones included."""
        rows = await list_keys(db_session)
        return [KeyView(r.id, r.name, r.scopes, r.created_at, r.revoked_at) for r in rows]

    @delete(
        "/{key_id:uuid}",
        summary="Revoke an API key",
        responses={404: ResponseSpec(None, description="No active key has this id")},
    )
    async def revoke(self, key_id: uuid.UUID, db_session: AsyncSession, services: Services) -> None:
        """Revoke a key; 404 when no active key has that id. Effective at once in this process
        (its cached look-up is dropped after the commit), within the key cache's TTL in others."""
        if not await revoke_key(db_session, key_id):
            raise NotFoundException(f"No active key {key_id}.")
        await db_session.commit()
        services.api_keys.forget(key_id)
