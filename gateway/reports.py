"""The stale report (reconciliation): `GET /v1/reports/stale` and `gateway report stale`.

Deliveries that stayed `sent`, `unknown` or `sending` longer than GATEWAY_STALE_REPORT_HOURS
without a final callback (the delivery log's part, `sender.log.stale_deliveries`), and
provider events still parked after as long (the event store's part,
`webhooks.store.stale_parked`), composed here. Counts per provider with the oldest, and a
bounded list of the oldest examples: ids, statuses and times only, never an address or a
recipient hash (a `read` key sees ids elsewhere too; it sees addresses only of its own
messages, and this report covers every client's).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import asdict, dataclass
from typing import IO, Annotated, Any

from litestar import Request, get
from litestar.datastructures import State
from litestar.exceptions import ClientException
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncEngine

from sender import log as dlog
from suppression.db import pg_connection, utcnow
from webhooks import store

MAX_EXAMPLES = 100
DEFAULT_EXAMPLES = 10
MAX_HOURS = 24 * 366


@dataclass
class StaleDeliveryGroup:
    """Stale deliveries of one provider (null: none chosen yet) and status."""

    provider: str | None
    status: str
    count: int
    oldest_updated_at: dt.datetime


@dataclass
class StaleDeliveryExample:
    """One stale delivery (the oldest come first)."""

    id: uuid.UUID
    message_id: uuid.UUID
    channel: str
    provider: str | None
    status: str
    provider_message_id: str | None
    attempts: int
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass
class StaleDeliveries:
    """Deliveries still waiting for a final callback."""

    total: int
    groups: list[StaleDeliveryGroup]
    examples: list[StaleDeliveryExample]


@dataclass
class ParkedEventGroup:
    """Parked events of one provider and event type."""

    provider: str
    event_type: str
    count: int
    oldest_received_at: dt.datetime


@dataclass
class ParkedEventExample:
    """One parked event (the oldest come first); `delivery_id` is set when it was parked
    for a delivery whose call was in flight and never applied."""

    id: uuid.UUID
    provider: str
    event_type: str
    provider_message_id: str | None
    delivery_id: uuid.UUID | None
    occurred_at: dt.datetime | None
    received_at: dt.datetime


@dataclass
class ParkedEvents:
    """Provider events that never matched a delivery (or were never applied)."""

    total: int
    groups: list[ParkedEventGroup]
    examples: list[ParkedEventExample]


@dataclass
class StaleReport:
    """What stayed unresolved for longer than `hours` (before `cutoff`)."""

    generated_at: dt.datetime
    hours: float
    cutoff: dt.datetime
    deliveries: StaleDeliveries
    parked_events: ParkedEvents


async def stale_report(
    engine: AsyncEngine, *, hours: float, limit: int, now: dt.datetime | None = None
) -> StaleReport:
    """Build the report (four read-only statements on one connection)."""
    now = now or utcnow()
    cutoff = now - dt.timedelta(hours=hours)
    async with pg_connection(engine) as conn:
        d_groups, d_rows = await dlog.stale_deliveries(conn, before=cutoff, limit=limit)
        e_groups, e_rows = await store.stale_parked(conn, before=cutoff, limit=limit)
    return StaleReport(
        generated_at=now,
        hours=hours,
        cutoff=cutoff,
        deliveries=StaleDeliveries(
            total=sum(g.count for g in d_groups),
            groups=[
                StaleDeliveryGroup(g.provider, g.status, g.count, g.oldest_updated_at)
                for g in d_groups
            ],
            examples=[
                StaleDeliveryExample(
                    r.id,
                    r.message_id,
                    r.channel,
                    r.provider,
                    r.status,
                    r.provider_message_id,
                    r.attempts,
                    r.created_at,
                    r.updated_at,
                )
                for r in d_rows
            ],
        ),
        parked_events=ParkedEvents(
            total=sum(g.count for g in e_groups),
            groups=[
                ParkedEventGroup(g.provider, g.event_type, g.count, g.oldest_received_at)
                for g in e_groups
            ],
            examples=[
                ParkedEventExample(
                    r.id,
                    r.provider,
                    r.event_type,
                    r.provider_message_id,
                    r.delivery_id,
                    r.occurred_at,
                    r.received_at,
                )
                for r in e_rows
            ],
        ),
    )


@get(
    "/v1/reports/stale",
    opt={"scope": "read"},
    tags=["reports"],
    summary="Deliveries without a final callback and parked events, past a number of hours",
)
async def stale_report_route(
    request: Request[Any, Any, Any],
    state: State,
    hours: Annotated[
        float | None,
        Parameter(
            gt=0,
            le=MAX_HOURS,
            description="Older than this many hours (default GATEWAY_STALE_REPORT_HOURS)",
            schema_extra={"one_of": None, "type": "number", "exclusive_minimum": 0},
        ),
    ] = None,
    limit: Annotated[
        int, Parameter(ge=1, le=MAX_EXAMPLES, description="Examples per part, oldest first")
    ] = DEFAULT_EXAMPLES,
) -> StaleReport:
    """Counts per provider with the oldest, and the oldest examples (no addresses)."""
    if hours is None and "hours" in request.query_params:
        # Litestar reads `hours=null` as no value; the contract says a number.
        raise ClientException("hours must be a number of hours above 0.")
    services = state.services
    return await stale_report(
        services.engine,
        hours=hours if hours is not None else services.settings.stale_report_hours,
        limit=limit,
    )


def _time(value: dt.datetime | None) -> str:
    return value.isoformat() if value is not None else "-"


def print_report(report: StaleReport, out: IO[str], *, as_json: bool) -> None:
    """`gateway report stale`: the report as one JSON document, or as tables."""
    if as_json:
        out.write(json.dumps(asdict(report), default=str, indent=2) + "\n")
        return
    d, e = report.deliveries, report.parked_events
    out.write(f"stale since {_time(report.cutoff)} ({report.hours:g} h)\n\n")
    out.write(f"deliveries without a final callback: {d.total}\n")
    out.write("provider\tstatus\tcount\toldest_updated_at\n")
    for g in d.groups:
        out.write(f"{g.provider or '-'}\t{g.status}\t{g.count}\t{_time(g.oldest_updated_at)}\n")
    if d.examples:
        out.write("\noldest: id\tmessage_id\tchannel\tprovider\tstatus\tupdated_at\n")
        for x in d.examples:
            out.write(
                f"{x.id}\t{x.message_id}\t{x.channel}\t{x.provider or '-'}\t{x.status}\t"
                f"{_time(x.updated_at)}\n"
            )
    out.write(f"\nparked provider events: {e.total}\n")
    out.write("provider\tevent_type\tcount\toldest_received_at\n")
    for p in e.groups:
        out.write(f"{p.provider}\t{p.event_type}\t{p.count}\t{_time(p.oldest_received_at)}\n")
    if e.examples:
        out.write("\noldest: id\tprovider\tevent_type\tprovider_message_id\treceived_at\n")
        for y in e.examples:
            out.write(
                f"{y.id}\t{y.provider}\t{y.event_type}\t{y.provider_message_id or '-'}\t"
                f"{_time(y.received_at)}\n"
            )
