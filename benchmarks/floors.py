"""The floors of the bench runner: two minimal Litestar + asyncpg apps on the gateway's database.

* ``insert_app`` ("insert floor"): ``POST /insert`` with ``{"k": ...}`` runs one INSERT.
* ``send_app`` ("send floor"): ``POST /send`` with ``{"k": ..., "to": ...}`` runs a SELECT by
  unique key on a 200,000-row table (the suppression look-up), an INSERT (the delivery) and
  an UPDATE of that row (the outcome): the SQL a send needs at least, on a raw asyncpg pool
  in autocommit (as in ../shared/perf/FLOORS.md, row "HTTP send").

Served by uvicorn like ``gateway serve`` (one process, no access log):
``BENCH_FLOOR_DSN=postgresql://... python -m benchmarks.floors send_app 8001``. `prepare(dsn)`
creates their tables (prefixed ``bench_floor_``) and `drop(dsn)` removes them.
"""

# ruff: noqa: S608  (SQL from module constants)

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import asyncpg
from litestar import Litestar, Request, post

POOL_SIZE = 16
SUPPRESSION_ROWS = 200_000

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS bench_floor_events (
  id bigserial PRIMARY KEY, k text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS bench_floor_suppressions (
  h text PRIMARY KEY, reason text NOT NULL);
CREATE TABLE IF NOT EXISTS bench_floor_deliveries (
  id bigserial PRIMARY KEY, k text NOT NULL, recipient_hash text NOT NULL,
  status text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO bench_floor_suppressions
  SELECT md5(i::text), 'hard_bounce' FROM generate_series(1, {SUPPRESSION_ROWS}) AS i
  ON CONFLICT DO NOTHING;
ANALYZE bench_floor_suppressions;
"""

_pool: asyncpg.Pool | None = None


async def prepare(dsn: str) -> None:
    """Create and fill the floors' tables."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(_SCHEMA)
    finally:
        await conn.close()


async def drop(dsn: str) -> None:
    """Drop the floors' tables."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "DROP TABLE IF EXISTS bench_floor_events, bench_floor_suppressions,"
            " bench_floor_deliveries"
        )
    finally:
        await conn.close()


def _dsn() -> str:
    return os.environ["BENCH_FLOOR_DSN"].replace("postgresql+asyncpg://", "postgresql://")


async def _start() -> None:
    global _pool
    _pool = await asyncpg.create_pool(_dsn(), min_size=POOL_SIZE, max_size=POOL_SIZE)


async def _stop() -> None:
    if _pool is not None:
        await _pool.close()


def _the_pool() -> asyncpg.Pool:
    assert _pool is not None
    return _pool


@post("/insert", status_code=201)
async def insert(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """One INSERT per request."""
    data = json.loads(await request.body())
    async with _the_pool().acquire() as conn:
        await conn.execute("INSERT INTO bench_floor_events (k) VALUES ($1)", data["k"])
    return {"ok": True}


@post("/send", status_code=201)
async def send(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """SELECT by unique key + INSERT + UPDATE per request."""
    data = json.loads(await request.body())
    recipient_hash = hashlib.sha256(data["to"].encode()).hexdigest()
    async with _the_pool().acquire() as conn:
        suppressed = await conn.fetchval(
            "SELECT reason FROM bench_floor_suppressions WHERE h = $1", recipient_hash
        )
        delivery_id = await conn.fetchval(
            "INSERT INTO bench_floor_deliveries (k, recipient_hash, status)"
            " VALUES ($1, $2, 'queued') RETURNING id",
            data["k"],
            recipient_hash,
        )
        await conn.execute(
            "UPDATE bench_floor_deliveries SET status = 'sent', updated_at = now() WHERE id = $1",
            delivery_id,
        )
    return {"id": delivery_id, "status": "suppressed" if suppressed else "sent"}


insert_app = Litestar([insert], on_startup=[_start], on_shutdown=[_stop])
send_app = Litestar([send], on_startup=[_start], on_shutdown=[_stop])


if __name__ == "__main__":
    import sys

    import uvicorn

    # python -m benchmarks.floors insert_app|send_app PORT: as `gateway serve` runs uvicorn.
    uvicorn.run(
        f"benchmarks.floors:{sys.argv[1]}",
        host="127.0.0.1",
        port=int(sys.argv[2]),
        access_log=False,
        log_level="warning",
    )
