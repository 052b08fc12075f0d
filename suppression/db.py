"""Persistence base shared by every package's tables.

`suppression` is the lowest layer of the gateway (it depends on no other package), so the
declarative base and the naming convention that all tables use live here; every other package
imports them from here and defines its own tables next to its own code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.util import greenlet_spawn

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every table; one MetaData for the whole schema."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> dt.datetime:
    """The current time, timezone-aware in UTC (all timestamps are stored as timestamptz)."""
    return dt.datetime.now(dt.UTC)


def new_id() -> uuid.UUID:
    """A new random primary key."""
    return uuid.uuid4()


# -- hot-path statements: asyncpg through the engine's pool ----------------------------------
#
# The hot paths (send, callback, suppression check, API-key look-up) run plain SQL on the
# asyncpg connection under SQLAlchemy's pool instead of ORM sessions or Core compilation:
# a statement costs one round trip and a few tens of microseconds of Python, and a single
# statement (CTEs included) is atomic on its own, so most of them need no BEGIN/COMMIT.

Pg = Any
"""An `asyncpg.Connection` (asyncpg ships no type information)."""

# Errors after which a pooled connection must not be used again.
_BROKEN = (asyncpg.InterfaceError, asyncpg.PostgresConnectionError, OSError)


@contextlib.asynccontextmanager
async def pg_connection(engine: AsyncEngine) -> AsyncIterator[Pg]:
    """An asyncpg connection from `engine`'s pool, in autocommit mode.

    Each statement is its own transaction unless the caller opens one with
    `async with conn.transaction():`. A connection that broke while in use is invalidated,
    so the pool replaces it instead of handing it out again. (Checked out of the pool
    directly, without an `AsyncConnection` around it: a third of the cost per checkout.)
    """
    fairy = await greenlet_spawn(engine.sync_engine.pool.connect)
    try:
        yield fairy.driver_connection
    except _BROKEN:
        await greenlet_spawn(fairy.invalidate)
        raise
    finally:
        await greenlet_spawn(fairy.close)


async def pg_of(db: AsyncSession | AsyncConnection | Pg) -> Pg:
    """The asyncpg connection under a session or connection, inside its transaction.

    For statements written for the hot paths that an ORM caller (admin, compliance) wants
    to run within its own transaction. SQLAlchemy's asyncpg adapter sends BEGIN lazily with
    its first statement; a statement sent to the driver directly must not run before it,
    so the transaction is started here when it has not been yet. An asyncpg connection is
    returned as it is.
    """
    if isinstance(db, AsyncSession):
        db = await db.connection()
    if not isinstance(db, AsyncConnection):
        return db
    fairy = await db.get_raw_connection()
    if getattr(fairy.dbapi_connection, "_transaction", None) is None:
        await db.exec_driver_sql("SELECT 1")
    return fairy.driver_connection


def jsonb(value: Any) -> str:
    """A Python value as a JSON/JSONB parameter: the engine's codec takes JSON text."""
    return json.dumps(value, separators=(",", ":"), default=str)
