"""The worker's claim at millions of queued rows: ``python -m benchmarks.claim_plan [--rows N]``.

Creates a scratch database (on the PostgreSQL of ``DATABASE_URL``), migrates it, queues
``--rows`` `low` deliveries due now (default 2,000,000, set-based) and 10 `high` ones created
after them, ANALYZEs, and prints ``EXPLAIN (ANALYZE, BUFFERS)`` of each lane's claim
statement (`sender.log._CLAIM_DUE`, batch 50) inside a transaction that is rolled back, so
nothing is claimed. Then drops the database. The plans show whether `ix_deliveries_due`
serves a priority-ordered claim without reading the backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import time
import uuid

import asyncpg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway import migrate
from sender.log import _CLAIM_DUE, _CLAIMABLE


def _sync(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(False)


async def _run(dsn: str, rows: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        start = time.perf_counter()
        message = uuid.uuid4()
        await conn.execute(
            "INSERT INTO messages (id, client_id, idempotency_key, fingerprint, state, channel, "
            "category, priority, metadata, created_at) VALUES ($1, $2, 'bench', 'x', "
            "'completed', 'sms', 'marketing', 'low', '{}', now())",
            message,
            uuid.uuid4(),
        )
        for rank, n in ((0, rows), (2, 10)):
            await conn.execute(
                "INSERT INTO deliveries (id, message_id, position, channel, recipient_hash, "
                "recipient_encrypted, derived_key, status, category, priority_rank, attempts, "
                "next_attempt_at, created_at, updated_at, parked_feedback) "
                "SELECT gen_random_uuid(), $1, 0, 'sms', md5(g::text), 'x', "
                "md5($2 || g::text), 'queued', 'marketing', $3, 0, now() - interval '1 minute' "
                "+ g * interval '1 microsecond', now(), now(), false "
                "FROM generate_series(1, $4) AS g",
                message,
                str(rank),
                rank,
                n,
            )
        await conn.execute("ANALYZE deliveries")
        print(f"queued {rows:,} low + 10 high in {time.perf_counter() - start:.0f} s")
        for lane, low, high in (("high", 2, 2), ("normal", 1, 2), ("low", 0, 2)):
            # In a transaction rolled back: the claim takes nothing for real.
            transaction = conn.transaction()
            await transaction.start()
            try:
                plan = await conn.fetch(
                    "EXPLAIN (ANALYZE, BUFFERS) " + _CLAIM_DUE,
                    dt.datetime.now(dt.UTC),
                    50,
                    _CLAIMABLE,
                    low,
                    high,
                )
            finally:
                await transaction.rollback()
            print(f"--- {lane} lane (ranks {low}..{high}), batch 50")
            print("\n".join(r[0] for r in plan))
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.claim_plan")
    parser.add_argument("--rows", type=int, default=2_000_000)
    args = parser.parse_args()
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"gwclaim_{uuid.uuid4().hex[:10]}"
    admin = create_engine(_sync(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(False)
    try:
        migrate.upgrade(url)
        asyncio.run(_run(url.replace("postgresql+asyncpg://", "postgresql://"), args.rows))
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
