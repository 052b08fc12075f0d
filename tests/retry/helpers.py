"""Test helpers of the retry suite: bulk delivery rows, a stub provider, a contract dispatch.

`ContractDispatch` follows the documented dispatch contract of the send path (re-check
suppression and deadline, one provider attempt written `in_progress` first, record the
outcome, reschedule or dead-letter by policy, return the resulting status) against a local
HTTP stub provider. The real dispatch lives in `sender` and has its own tests; here the units
under test are the worker, the policy, the limiter/breaker hooks and the DLQ.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry.breaker import CircuitBreaker
from retry.dlq import dead_letter
from retry.policy import backoff_from_settings, next_attempt_at
from retry.queue import PRIORITY_NAMES, attempts, deliveries, schedule
from retry.ratelimit import RateLimiter
from retry.settings import RetrySettings
from suppression import service as suppression_service
from suppression.db import utcnow


class _Server(ThreadingHTTPServer):
    # Many workers connect at once: a deeper accept queue than the default 5.
    request_queue_size = 256
    daemon_threads = True


# Columns the set-based INSERT fills itself; any other NOT NULL column of the (evolving)
# schema gets its model's scalar default, so the helper follows schema changes.
_MESSAGE_VALUES = {
    "id": "gen_random_uuid()",
    "client_id": "CAST(:client AS uuid)",
    "idempotency_key": ":tag || '-' || g",
    "fingerprint": "md5(g::text)",
    "state": "'completed'",
    "channel": ":channel",
    "category": ":category",
    "topic": ":topic",
    "priority": ":priority",
    "expires_at": ":expires_at",
    "created_at": "now()",
}
_DELIVERY_VALUES = {
    "id": "gen_random_uuid()",
    "message_id": "m.id",
    "channel": ":channel",
    "recipient_hash": "COALESCE(:recipient_hash, md5(m.id::text))",
    "recipient_encrypted": "'synthetic-ciphertext'",
    "derived_key": "encode(sha256(CAST(m.id::text AS bytea)), 'hex')",
    "status": ":status",
    "category": ":category",
    "topic": ":topic",
    "priority_rank": ":rank",
    "expires_at": ":expires_at",
    "attempts": ":attempts",
    "next_attempt_at": ":next_at",
    "created_at": "now()",
    "updated_at": "now()",
}


def _with_defaults(table_name: str, values: dict[str, str]) -> dict[str, str]:
    import sender.models  # noqa: F401  (registers the tables)
    from suppression.db import Base

    table = Base.metadata.tables[table_name]
    out = dict(values)
    for col in table.columns:
        if col.name in out or col.nullable:
            continue
        default = col.default
        if default is not None and default.is_scalar:
            value = default.arg
            out[col.name] = (
                f"'{json.dumps(value)}'::jsonb" if isinstance(value, dict | list) else repr(value)
            )
        elif default is not None and default.is_callable and col.name not in out:
            name = getattr(default.arg, "__name__", "")
            out[col.name] = (
                "'{}'::jsonb" if name == "dict" else "'[]'::jsonb" if name == "list" else "now()"
            )
    return out


def _insert_sql() -> Any:
    m = _with_defaults("messages", _MESSAGE_VALUES)
    d = _with_defaults("deliveries", _DELIVERY_VALUES)
    return text(
        f"""
        WITH m AS (
          INSERT INTO messages ({", ".join(f'"{k}"' for k in m)})
          SELECT {", ".join(m.values())} FROM generate_series(1, :n) AS g
          RETURNING id
        )
        INSERT INTO deliveries ({", ".join(f'"{k}"' for k in d)})
        SELECT {", ".join(d.values())} FROM m
        RETURNING id
        """
    )


RANKS = {"high": 2, "normal": 1, "low": 0}


async def insert_deliveries(
    session: AsyncSession,
    n: int,
    *,
    channel: str = "sms",
    priority: str = "normal",
    status: str = "retrying",
    category: str = "transactional",
    topic: str | None = None,
    next_at: dt.datetime | None = None,
    expires_at: dt.datetime | None = None,
    attempts_made: int = 0,
    recipient_hash: str | None = None,
) -> list[uuid.UUID]:
    """Insert `n` messages with one delivery each, in one set-based statement (not committed)."""
    rows = await session.execute(
        _insert_sql(),
        {
            "client": str(uuid.uuid4()),
            "tag": uuid.uuid4().hex[:8],
            "n": n,
            "channel": channel,
            "category": category,
            "topic": topic,
            "priority": priority,
            "rank": RANKS[priority],
            "expires_at": expires_at,
            "status": status,
            "attempts": attempts_made,
            "next_at": next_at if next_at is not None else utcnow(),
            "recipient_hash": recipient_hash,
        },
    )
    return [r[0] for r in rows]


class StubProvider:
    """A tiny local HTTP provider: POST /send {"id": ...}; counts calls per delivery id.

    `script[id]` is a list of status codes to answer in turn (then `default`); a 429/503 may
    carry `retry_after` seconds.
    """

    def __init__(self, *, default: int = 200, retry_after: float | None = None) -> None:
        self.default = default
        self.retry_after = retry_after
        self.script: dict[str, list[int]] = {}
        self.calls: Counter[str] = Counter()
        self.times: dict[str, list[float]] = defaultdict(list)
        self.order: list[str] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                ident = str(body.get("id"))
                with stub._lock:
                    stub.calls[ident] += 1
                    stub.times[ident].append(time.monotonic())
                    stub.order.append(ident)
                    queue = stub.script.get(ident)
                    code = queue.pop(0) if queue else stub.default
                payload = json.dumps({"sid": f"SM{uuid.uuid4().hex}"}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                if code in (429, 503) and stub.retry_after is not None:
                    self.send_header("Retry-After", str(stub.retry_after))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/send"

    @contextmanager
    def running(self) -> Iterator[StubProvider]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


class MaxRng(random.Random):
    """A random source whose jitter always lands on the top of the range (deterministic)."""

    def uniform(self, a: float, b: float) -> float:
        return b


class ContractDispatch:
    """A dispatch following the send path's documented contract, against `StubProvider`."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: RetrySettings,
        url: str,
        *,
        limiter: RateLimiter | None = None,
        breaker: CircuitBreaker | None = None,
        rng: random.Random | None = None,
        provider: str = "stub",
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.url = url
        self.limiter = limiter
        self.breaker = breaker
        self.rng = rng
        self.provider = provider
        self.scheduled_delays: list[float] = []
        self.client = httpx.AsyncClient(timeout=10.0)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __call__(self, delivery_id: uuid.UUID) -> str:
        now = utcnow()
        async with self.sessions() as s, s.begin():
            d = (
                await s.execute(
                    select(deliveries).where(deliveries.c.id == delivery_id).with_for_update()
                )
            ).one()
            topic = await s.scalar(
                text("SELECT topic FROM deliveries WHERE id = :id"), {"id": delivery_id}
            )
            rhash = await s.scalar(
                text("SELECT recipient_hash FROM deliveries WHERE id = :id"), {"id": delivery_id}
            )
            if d.status not in ("queued", "sending", "retrying", "unknown"):
                return str(d.status)
            hit = await suppression_service.check(
                s, d.channel, rhash, category=d.category, topic=topic
            )
            if hit is not None:
                await s.execute(
                    update(deliveries)
                    .where(deliveries.c.id == delivery_id)
                    .values(status="suppressed", reason=hit.reason, next_attempt_at=None)
                )
                return "suppressed"
            if d.expires_at is not None and d.expires_at <= now:
                await dead_letter(s, delivery_id, reason="expired", last_error=None)
                return "dead"
            priority = PRIORITY_NAMES[d.priority_rank]
            deferred = (
                self.breaker is not None and not await self.breaker.allow(self.provider)
            ) or (
                self.limiter is not None and not await self.limiter.acquire(self.provider, priority)
            )
            if deferred:
                at = now + dt.timedelta(seconds=self.settings.defer_seconds)
                await schedule(s, delivery_id, at=at, status="retrying")
                return "retrying"
            number = (
                await s.scalar(
                    select(func.coalesce(func.max(attempts.c.number), 0)).where(
                        attempts.c.delivery_id == delivery_id
                    )
                )
                or 0
            ) + 1
            attempt_id = uuid.uuid4()
            await s.execute(
                attempts.insert().values(
                    id=attempt_id,
                    delivery_id=delivery_id,
                    number=number,
                    status="in_progress",
                    provider=self.provider,
                    started_at=now,
                )
            )
            await s.execute(
                update(deliveries)
                .where(deliveries.c.id == delivery_id)
                .values(status="sending", attempts=deliveries.c.attempts + 1)
            )
        # The provider call, outside any transaction.
        response = await self.client.post(self.url, json={"id": str(delivery_id)})
        done = utcnow()
        async with self.sessions() as s, s.begin():
            if response.status_code < 300:
                await s.execute(
                    update(attempts)
                    .where(attempts.c.id == attempt_id)
                    .values(
                        status="accepted",
                        finished_at=done,
                        provider_message_id=response.json()["sid"],
                    )
                )
                await s.execute(
                    update(deliveries)
                    .where(deliveries.c.id == delivery_id)
                    .values(status="sent", next_attempt_at=None, last_error=None)
                )
                if self.breaker is not None:
                    await self.breaker.record_success(self.provider)
                return "sent"
            error = f"HTTP {response.status_code}"
            await s.execute(
                update(attempts)
                .where(attempts.c.id == attempt_id)
                .values(
                    status="transient",
                    finished_at=done,
                    error_code=str(response.status_code),
                    error_message=error,
                )
            )
            if self.breaker is not None:
                await self.breaker.record_failure(self.provider)
            retry_after = response.headers.get("Retry-After")
            backoff = backoff_from_settings(self.settings, d.channel, priority)
            at = next_attempt_at(
                backoff,
                d.attempts + 1,
                done,
                expires_at=d.expires_at,
                rng=self.rng,
                retry_after=float(retry_after) if retry_after else None,
            )
            if at is None:
                out_of_time = d.expires_at is not None and d.attempts + 1 < backoff.max_attempts
                await dead_letter(
                    s,
                    delivery_id,
                    reason="expired" if out_of_time else "max_attempts",
                    last_error=error,
                )
                return "dead"
            self.scheduled_delays.append((at - done).total_seconds())
            await schedule(s, delivery_id, at=at, status="retrying", last_error=error)
            return "retrying"


class TwilioStub:
    """A local stand-in for Twilio's Messages API, reached by the real `twilio` client.

    Counts `messages.create` calls per recipient (`To`) and answers each from `script[to]`
    (status codes in turn), then `default` (201). `deliveries[to]` holds the delivery ids seen
    (they travel in the StatusCallback URL's `d` parameter).
    """

    def __init__(self, *, default: int = 201) -> None:
        self.default = default
        self.script: dict[str, list[int]] = {}
        self.calls: Counter[str] = Counter()
        self.times: dict[str, list[float]] = defaultdict(list)
        self.deliveries: dict[str, set[str]] = defaultdict(set)
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                from urllib.parse import parse_qs, urlsplit

                length = int(self.headers.get("Content-Length", "0"))
                form = parse_qs(self.rfile.read(length).decode())
                callback = form.get("StatusCallback", [""])[0]
                ident = form.get("To", ["?"])[0]
                with stub._lock:
                    stub.deliveries[ident].add(
                        parse_qs(urlsplit(callback).query).get("d", ["?"])[0]
                    )
                    stub.calls[ident] += 1
                    stub.times[ident].append(time.monotonic())
                    queue = stub.script.get(ident)
                    code = queue.pop(0) if queue else stub.default
                if code < 300:
                    body: dict[str, Any] = {
                        "sid": f"SM{uuid.uuid4().hex}",
                        "status": "queued",
                        "to": form.get("To", [""])[0],
                        "from": form.get("From", [""])[0],
                        "account_sid": self.path.split("/")[3],
                    }
                else:
                    body = {"code": 20500, "message": "Internal Server Error", "status": code}
                payload = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[TwilioStub]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
