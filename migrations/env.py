"""Alembic environment: online migrations over the async engine, one MetaData for all tables."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

import gateway.models  # noqa: F401  (registers the tables on the shared metadata)
import retry.models  # noqa: F401
import sender.models  # noqa: F401
import suppression.models  # noqa: F401
import webhooks.models
import webhooks.outbound.models  # noqa: F401
from gateway.db import async_url
from suppression.db import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        compare_server_default=True,
    )
    with context.begin_transaction():
        # Several gateway processes may start at once; one migrates, the others wait here.
        connection.execute(text("SELECT pg_advisory_xact_lock(7365021)"))
        context.run_migrations()


async def _online() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    url = context.config.attributes.get("database_url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = create_async_engine(async_url(str(url)), poolclass=NullPool)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
asyncio.run(_online())
