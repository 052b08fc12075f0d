"""Benchmark of a campaign's bulk paths (not a test): list upload and expansion.

Run: ``.venv/bin/python benchmarks/campaigns.py [--recipients 200000] [--batch 5000]``. Uses
DATABASE_URL when set (a scratch database is created and dropped on that server), else an
embedded PostgreSQL. In-process through the app (httpx ASGI transport, no HTTP server):

1. `POST /v1/campaigns` (email, marketing);
2. `PUT /v1/campaigns/{id}/recipients` with `--recipients` JSON Lines records (distinct
   addresses, 1 % of them on the suppression list), streamed from a generator in 64 KiB
   chunks: prints records/s and the process's peak RSS growth;
3. `POST /v1/campaigns/{id}/start`, then the expansion job's batches (`--batch` recipients
   each) back to back until the campaign is `sending`: prints recipients/s (the issue's
   floor: 10,000/s).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.send import _server_url, _sync  # noqa: E402
from gateway import migrate  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.keys import create_key  # noqa: E402
from gateway.services import build_services  # noqa: E402
from gateway.settings import load_settings  # noqa: E402
from suppression.db import pg_connection  # noqa: E402

PUBLIC = "https://gateway.bench"


def _address(i: int) -> str:
    return f"user.{i}@example{i % 97}.com"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _list(n: int) -> AsyncIterator[bytes]:
    chunk: list[bytes] = []
    size = 0
    for i in range(n):
        line = json.dumps({"to": _address(i), "metadata": {"n": str(i)}}).encode() + b"\n"
        chunk.append(line)
        size += len(line)
        if size >= 65536:
            yield b"".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield b"".join(chunk)


async def bench(url: str, n: int, batch: int) -> None:
    """Upload and expand one campaign of `n` recipients."""
    env = {
        "DATABASE_URL": url,
        "GATEWAY_SECRET_KEYS": Fernet.generate_key().decode(),
        "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "GATEWAY_PUBLIC_URL": PUBLIC,
        "GATEWAY_WORKER_ENABLED": "false",
    }
    settings = load_settings(env)
    services = build_services(settings, url)
    try:
        async with services.sessions() as session:
            _, key = await create_key(session, ["send", "read"])
            await session.commit()
        # 1 % of the list suppressed (set-based: straight into the table, as an import would).
        suppressed = [_address(i) for i in range(0, n, 100)]
        async with pg_connection(services.engine) as conn:
            await conn.executemany(
                "INSERT INTO suppressions (id, channel, address_hash, address_encrypted, scope, "
                "reason, source_type, evidence, created_at) VALUES ($1, 'email', $2, $3, 'all', "
                "'hard_bounce', 'import', '{}'::jsonb, now())",
                [(uuid.uuid4(), services.protector.hash("email", a), "x") for a in suppressed],
            )
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC, timeout=3600) as client:
            auth = {"Authorization": f"Bearer {key}"}
            r = await client.post(
                "/v1/campaigns",
                headers={**auth, "Idempotency-Key": '"bench"'},
                json={
                    "channel": "email",
                    "subject": "Sale",
                    "text": "20 % off",
                    "category": "marketing",
                },
            )
            campaign_id = r.json()["id"]
            rss = _rss_mib()
            start = time.perf_counter()
            r = await client.put(
                f"/v1/campaigns/{campaign_id}/recipients",
                headers={**auth, "Content-Type": "application/x-ndjson"},
                content=_list(n),
            )
            took = time.perf_counter() - start
            print(f"upload: {r.status_code} {r.json()}")
            print(
                f"upload: {n} records in {took:.1f} s = {n / took:,.0f} records/s; "
                f"peak RSS +{_rss_mib() - rss:.0f} MiB"
            )
            r = await client.post(f"/v1/campaigns/{campaign_id}/start", headers=auth)
            assert r.status_code == 202, r.text
            start = time.perf_counter()
            batches = 0
            while (await services.campaigns.expand_once(batch=batch)).campaign_id is not None:
                batches += 1
            took = time.perf_counter() - start
            print(
                f"expansion: {n} recipients in {batches} batches of {batch}, {took:.1f} s = "
                f"{n / took:,.0f} recipients/s (floor 10,000/s)"
            )
            r = await client.get(f"/v1/campaigns/{campaign_id}", headers=auth)
            print(f"campaign: {r.json()['state']} {r.json()['counts']}")
    finally:
        await services.close()


def main() -> None:
    """Create a scratch database, run the benchmark, drop it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5000)
    args = parser.parse_args()
    server, cleanup = _server_url()
    name = f"gwbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(_sync(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(False)
    try:
        migrate.upgrade(url)
        asyncio.run(bench(url, args.recipients, args.batch))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        cleanup()


if __name__ == "__main__":
    os.environ.setdefault("GATEWAY_LOG_LEVEL", "WARNING")
    main()
