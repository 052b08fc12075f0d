"""Persistence base shared by every package's tables.

`suppression` is the lowest layer of the gateway (it depends on no other package), so the
declarative base and the naming convention that all tables use live here; every other package
imports them from here and defines its own tables next to its own code.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
from sqlalchemy import MetaData
from sqlalchemy import exc as sa_exc
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


# Random bytes for `new_id`, read from the OS this many at a time.
_ID_POOL_BYTES = 4096
_id_pool = b""
_id_offset = 0
_id_lock = threading.Lock()


def new_id() -> uuid.UUID:
    """A new random primary key: a version 4 UUID, as `uuid.uuid4()` makes it.

    Its random bits come from `os.urandom` like uuid4's, but read 4 KiB at a time: on the
    hot paths (a send makes three ids) one `getrandom` system call per id cost more than
    the rest of the id. A forked child discards the bytes its parent may also use.
    """
    global _id_pool, _id_offset
    with _id_lock:
        if _id_offset + 16 > len(_id_pool):
            _id_pool, _id_offset = os.urandom(_ID_POOL_BYTES), 0
        raw = _id_pool[_id_offset : _id_offset + 16]
        _id_offset += 16
    return uuid.UUID(bytes=raw, version=4)


def _forget_ids() -> None:
    global _id_pool, _id_offset
    _id_pool, _id_offset = b"", 0


os.register_at_fork(after_in_child=_forget_ids)


# -- hot-path statements: asyncpg through the engine's pool ----------------------------------
#
# The hot paths (send, callback, suppression check, API-key look-up) run plain SQL on the
# asyncpg connection under SQLAlchemy's pool instead of ORM sessions or Core compilation:
# a statement costs one round trip and a few tens of microseconds of Python, and a single
# statement (CTEs included) is atomic on its own, so most of them need no BEGIN/COMMIT.

Pg = Any
"""An `asyncpg.Connection` (asyncpg ships no type information)."""


class DatabaseUnavailable(Exception):
    """The database cannot be reached or dropped the connection: nothing was done, retry later.

    Raised where a caller turns a driver failure into a statement about availability (the
    API-key look-up); anything else may raise the driver's own errors, which
    `is_database_unavailable` recognises too."""


# Failures of the server or the link, not of the statement: the database is (for now) gone.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    asyncpg.InterfaceError,  # "connection is closed", "cannot perform operation: ..."
    asyncpg.InternalClientError,  # "another operation is in progress" on a broken connection
    asyncpg.PostgresConnectionError,  # ConnectionDoesNotExistError, ConnectionFailureError
    asyncpg.exceptions.OperatorInterventionError,  # admin/crash shutdown, cannot connect now
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # no pooled connection became free in time
    DatabaseUnavailable,
)

# OSError (a refused connection, a missing Unix socket: FileNotFoundError when an embedded
# server died) and TimeoutError (a connect that never completed) reach us raw from the
# driver's connect. They count when raised as they are, or under a database error; under
# another library's error (Redis wraps its own connection failures around an OSError) they
# say nothing about the database.
_NETWORK: tuple[type[BaseException], ...] = (OSError, TimeoutError)

_DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    sa_exc.SQLAlchemyError,
    DatabaseUnavailable,
)

# Failures after which no connection opened before them can be trusted (the server went
# away): the whole pool is marked stale and each connection is replaced at its next checkout,
# at no cost to the checkouts of a healthy pool.
_SERVER_GONE: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
)


def _causes(exc: BaseException) -> Iterator[tuple[BaseException, bool]]:
    """`exc` and everything it wraps (SQLAlchemy's `.orig`, explicit causes, implicit
    context unless suppressed, members of exception groups), each with whether it was raised
    by the database driver's side (`exc` itself, or something under a database error)."""
    seen: set[int] = set()
    stack = [(exc, True)]
    while stack:
        current, ours = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current, ours
        if isinstance(current, BaseExceptionGroup):
            stack.extend((member, ours) for member in current.exceptions)
        below = isinstance(current, _DATABASE_ERRORS)
        orig = getattr(current, "orig", None)
        if isinstance(orig, BaseException):
            stack.append((orig, below))
        if current.__cause__ is not None:
            stack.append((current.__cause__, below))
        elif current.__context__ is not None and not current.__suppress_context__:
            stack.append((current.__context__, below))


def is_database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) says the database is unreachable or dropped the
    connection, as opposed to refusing a statement: the request may be retried later."""
    for cause, ours in _causes(exc):
        if isinstance(cause, _UNAVAILABLE) or (ours and isinstance(cause, _NETWORK)):
            return True
        if isinstance(cause, sa_exc.DBAPIError) and cause.connection_invalidated:
            return True
    return False


def _server_gone(exc: BaseException) -> bool:
    return any(
        isinstance(cause, _SERVER_GONE) or (ours and isinstance(cause, _NETWORK))
        for cause, ours in _causes(exc)
    )


@contextlib.asynccontextmanager
async def pg_connection(engine: AsyncEngine) -> AsyncIterator[Pg]:
    """An asyncpg connection from `engine`'s pool, in autocommit mode.

    Each statement is its own transaction unless the caller opens one with
    `async with conn.transaction():`. (Checked out of the pool directly, without an
    `AsyncConnection` around it: a third of the cost per checkout.)

    A connection is never handed out again after it broke: a driver or network failure
    invalidates it (its next user would otherwise get "connection is closed" or "another
    operation is in progress"). When the failure says the server itself went away, every
    connection of the pool opened before it is replaced at its next checkout. No round trip
    is spent on checking connections at checkout (no pre-ping): a dead one fails its first
    statement, is dropped, and that request gets a 503.
    """
    fairy = await greenlet_spawn(engine.sync_engine.pool.connect)
    pg: Pg = fairy.driver_connection
    try:
        yield pg
    except Exception as exc:
        if pg.is_closed() or is_database_unavailable(exc):
            if _server_gone(exc):
                engine.sync_engine.pool._invalidate(fairy, exc, _checkin=False)
            await greenlet_spawn(fairy.invalidate, exc)
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
