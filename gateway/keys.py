"""API keys: creation (the secret is shown once), listing, revocation and look-up by hash.

The request path never comes here directly: `gateway.keycache.KeyCache` answers from memory
and calls `lookup_principal` (one plain SQL statement on an asyncpg connection) on a miss.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.models import ApiKey
from suppression.db import Pg, pg_of, utcnow

SCOPES = ("send", "read", "admin", "export")
KEY_PREFIX = "gw_"


class UnknownScopeError(ValueError):
    """A scope that is not one of SCOPES."""


MAX_KEY_NAME = 200
"""The longest key name (characters), for the API and the CLI alike."""


def key_name_problem(name: str) -> str | None:
    """Why `name` cannot name a key (too long, or a control character), or None."""
    if len(name) > MAX_KEY_NAME:
        return f"a key name has at most {MAX_KEY_NAME} characters ({len(name)} given)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a key name is one line of text without control characters"
    return None


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: which key, with which scopes."""

    key_id: uuid.UUID
    name: str
    scopes: frozenset[str]

    def allows(self, scope: str) -> bool:
        """`admin` implies every other scope."""
        return scope in self.scopes or "admin" in self.scopes


def hash_secret(secret: str) -> str:
    """Keys are 256-bit random, so a plain SHA-256 is a sufficient one-way look-up hash."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(raw: str | Iterable[str]) -> list[str]:
    """Validate a comma separated (or listed) set of scopes; keep their canonical order."""
    items = [s.strip() for s in (raw.split(",") if isinstance(raw, str) else raw) if s.strip()]
    unknown = sorted(set(items) - set(SCOPES))
    if unknown or not items:
        given = ", ".join(unknown) or "(none given)"
        raise UnknownScopeError(f"unknown scope(s) {given}; choose from {', '.join(SCOPES)}")
    return [s for s in SCOPES if s in items]


async def create_key(
    session: AsyncSession, scopes: Sequence[str], name: str = ""
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the secret, which is never stored or shown again."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(name=name, secret_hash=hash_secret(secret), scopes=list(parse_scopes(scopes)))
    session.add(row)
    await session.flush()
    return row, secret


async def list_keys(session: AsyncSession) -> list[ApiKey]:
    """All keys, oldest first (revoked ones included, marked)."""
    return list((await session.scalars(select(ApiKey).order_by(ApiKey.created_at))).all())


async def revoke_key(session: AsyncSession, key_id: uuid.UUID) -> bool:
    """Revoke a key; False when no active key has that id."""
    result = await session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


_LOOKUP = "SELECT id, name, scopes FROM api_keys WHERE secret_hash = $1 AND revoked_at IS NULL"


async def lookup_principal(pg: Pg, secret_hash: str) -> Principal | None:
    """The principal of an active key by the hash of its secret (one statement, unique index),
    or None when no active key has it. `pg` is an asyncpg connection (`pg_connection`)."""
    row = await pg.fetchrow(_LOOKUP, secret_hash)
    if row is None:
        return None
    # asyncpg returns its own UUID type; the rest of the code compares uuid.UUID values.
    return Principal(
        key_id=uuid.UUID(str(row["id"])), name=row["name"], scopes=frozenset(row["scopes"])
    )


_LOOKUP_BY_ID = "SELECT id, name, scopes FROM api_keys WHERE id = $1 AND revoked_at IS NULL"


async def lookup_principal_by_id(pg: Pg, key_id: uuid.UUID) -> Principal | None:
    """The principal of an active key by its id (one primary-key statement), or None when the
    key is unknown or revoked. The console checks its session's key with it on every request,
    so a revocation ends the key's console sessions at once."""
    row = await pg.fetchrow(_LOOKUP_BY_ID, key_id)
    if row is None:
        return None
    return Principal(
        key_id=uuid.UUID(str(row["id"])), name=row["name"], scopes=frozenset(row["scopes"])
    )


async def authenticate(session: AsyncSession, secret: str) -> Principal | None:
    """The principal for a presented secret, or None when unknown or revoked (uncached; for
    callers inside an ORM transaction; requests go through `gateway.keycache.KeyCache`)."""
    return await lookup_principal(await pg_of(session), hash_secret(secret))


async def has_any_key(session: AsyncSession) -> bool:
    """True once any key exists (used to print an admin key at first start only)."""
    return (await session.scalar(select(ApiKey.id).limit(1))) is not None


async def active_scopes(pg: Pg, key_id: uuid.UUID) -> frozenset[str] | None:
    """The scopes of an active key by id, or None when no active key has it (one statement,
    on the caller's asyncpg connection: the webhook fan-out's visibility)."""
    scopes = await pg.fetchval(
        "SELECT scopes FROM api_keys WHERE id = $1 AND revoked_at IS NULL", key_id
    )
    return frozenset(scopes) if scopes is not None else None
