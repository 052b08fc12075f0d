"""Test helpers of the retry suite: bulk delivery rows, row reads, a worker runner, a stub
provider, a contract dispatch.

`ContractDispatch` follows the documented dispatch contract of the send path (re-check
suppression and deadline, one provider attempt written `in_progress` first, record the
outcome, reschedule or dead-letter by policy, return the resulting status) against a local
HTTP stub provider. The real dispatch lives in `sender` and has its own tests; here the units
under test are the worker, the policy, the limiter/breaker hooks and the DLQ.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import Row, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from retry.breaker import CircuitBreaker
from retry.policy import Action, Failure, backoff_from_settings, decide
from retry.ratelimit import RateLimiter
from retry.settings import RetrySettings
from retry.worker import Worker
from sender import log as dlog
from sender.status import RANK_PRIORITY
from suppression import service as suppression_service
from suppression.db import pg_of, utcnow
from tests.stubs._server import Behavior, Call, StubServer
from tests.support.tables import attempts, deliveries

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


async def delivery_row(
    sessions: async_sessionmaker[AsyncSession], delivery_id: uuid.UUID, *columns: Any
) -> Row[Any]:
    """These columns of one delivery row, as stored now."""
    async with sessions() as s:
        return (await s.execute(select(*columns).where(deliveries.c.id == delivery_id))).one()


async def delivery_status(
    sessions: async_sessionmaker[AsyncSession], delivery_id: uuid.UUID
) -> str:
    """The status of one delivery, as stored now."""
    status: str = (await delivery_row(sessions, delivery_id, deliveries.c.status)).status
    return status


async def attempt_rows(
    sessions: async_sessionmaker[AsyncSession], delivery_id: uuid.UUID
) -> list[tuple[int, str]]:
    """(number, status) of a delivery's attempts, in the order they were started."""
    async with sessions() as s:
        rows = await s.execute(
            select(attempts.c.number, attempts.c.status)
            .where(attempts.c.delivery_id == delivery_id)
            .order_by(attempts.c.started_at, attempts.c.number)
        )
        return [(r.number, r.status) for r in rows]


async def run_worker_until(
    worker: Worker, done: Callable[[], Awaitable[bool]], *, polls: int = 1500
) -> None:
    """Run `worker` in the background until `done()` holds, then cancel it.

    `polls` (every 20 ms) is a guard against hanging, not a timing assertion.
    """
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(polls):
            if await done():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the worker did not get there")
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass


class StubProvider(StubServer):
    """A tiny local HTTP provider: `POST /send {"id": ...}` answers 200 `{"sid": ...}`.

    Calls are recorded per delivery id (the `Call.recipient`); `fail(delivery_id, codes)`
    scripts error answers for that delivery, in turn, before it is accepted again. A 429/503
    carries `Retry-After: retry_after` when that is set.
    """

    def __init__(self, *, retry_after: float | None = None) -> None:
        super().__init__()
        self.retry_after = retry_after

    @property
    def url(self) -> str:
        return f"{super().url}/send"

    def fail(self, delivery_id: uuid.UUID, codes: list[int]) -> None:
        """Answer the next requests for `delivery_id` with these HTTP status codes."""
        self.then_to(str(delivery_id), *(Behavior.error(c, None, f"HTTP {c}") for c in codes))

    def calls_for(self, delivery_id: uuid.UUID) -> list[Call]:
        """The requests made for `delivery_id`, in arrival order."""
        return self.calls_to(str(delivery_id))

    def parse(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[Any, str | None]:
        body = json.loads(raw or b"{}")
        return body, str(body.get("id"))

    def success(self, body: Any) -> tuple[int, dict[str, Any], dict[str, Any]]:
        sid = f"SM{uuid.uuid4().hex}"
        return 200, {"sid": sid}, {**body, "sid": sid}

    def failure(self, behavior: Behavior) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {}
        if behavior.status in (429, 503) and self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return behavior.status, {"message": behavior.message}, headers


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
                await dlog.dead_letter(
                    await pg_of(s), delivery_id, reason="expired", last_error=None, now=utcnow()
                )
                return "dead"
            priority = RANK_PRIORITY[d.priority_rank]
            deferred = (
                self.breaker is not None and not await self.breaker.allow(self.provider)
            ) or (
                self.limiter is not None and not await self.limiter.acquire(self.provider, priority)
            )
            if deferred:
                at = now + dt.timedelta(seconds=self.settings.defer_seconds)
                await dlog.schedule(
                    await pg_of(s), delivery_id, at=at, status="retrying", now=utcnow()
                )
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
            # The same decision as the real dispatch (retry.policy.decide).
            decision = decide(
                Failure.TRANSIENT,
                backoff=backoff,
                attempts_made=d.attempts + 1,
                now=done,
                expires_at=d.expires_at,
                settings=self.settings,
                rng=self.rng,
                retry_after=float(retry_after) if retry_after else None,
            )
            if decision.action == Action.DEAD:
                assert decision.dead_reason is not None
                await dlog.dead_letter(
                    await pg_of(s),
                    delivery_id,
                    reason=decision.dead_reason,
                    last_error=error,
                    now=done,
                )
                return "dead"
            at = decision.at
            assert at is not None
            self.scheduled_delays.append((at - done).total_seconds())
            await dlog.schedule(
                await pg_of(s), delivery_id, at=at, status="retrying", last_error=error, now=done
            )
            return "retrying"
