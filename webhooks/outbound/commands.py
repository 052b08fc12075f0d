"""The work behind `gateway webhooks list|create|disable|enable|rotate|test|replay`.

The CLI in `gateway.cli` parses arguments and builds the `Endpoints`; these functions do the
work. Data (lists, secrets, results) goes to stdout, messages to stderr.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any, TextIO

from webhooks.outbound import store
from webhooks.outbound.endpoints import EndpointNotFound, Endpoints, InvalidEndpoint


class CommandError(Exception):
    """A problem to report on stderr; `status` is the exit status (1: not found or failed,
    2: refused input)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _view(row: store.EndpointRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "url": row.url,
        "description": row.description,
        "events": row.events,
        "api_key_id": str(row.api_key_id),
        "enabled": row.enabled,
        "disabled_reason": row.disabled_reason,
        "disabled_since": row.disabled_at.isoformat() if row.disabled_at else None,
        "failing_since": row.failing_since.isoformat() if row.failing_since else None,
        "created_at": row.created_at.isoformat(),
    }


def _state(row: store.EndpointRow) -> str:
    return "enabled" if row.enabled else f"disabled:{row.disabled_reason}"


def _id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise CommandError(f"not an endpoint id: {raw}", 2) from None


async def list_endpoints(endpoints: Endpoints, *, as_json: bool, out: TextIO) -> None:
    """One line per endpoint: id, state, events, URL, description (or JSON Lines)."""
    for row in await endpoints.list_all():
        if as_json:
            out.write(json.dumps(_view(row)) + "\n")
        else:
            out.write(
                f"{row.id}\t{_state(row)}\t{','.join(row.events)}\t{row.url}\t{row.description}\n"
            )


async def create(
    endpoints: Endpoints,
    *,
    url: str,
    events: Sequence[str],
    description: str,
    api_key_id: str,
    out: TextIO,
    err: TextIO,
) -> None:
    """Create an endpoint; its signing secret alone on stdout (shown this once)."""
    key_id = _id(api_key_id)
    try:
        row, secret = await endpoints.create(
            url=url, events=events, description=description, api_key_id=key_id
        )
    except InvalidEndpoint as exc:
        raise CommandError(str(exc), 2) from None
    err.write(f"created endpoint {row.id} events={','.join(row.events)}\n")
    out.write(secret + "\n")


async def set_enabled(
    endpoints: Endpoints, endpoint_id: str, *, enabled: bool, err: TextIO
) -> None:
    """Enable or disable an endpoint."""
    try:
        row = await endpoints.update(_id(endpoint_id), enabled=enabled)
    except EndpointNotFound:
        raise CommandError(f"no endpoint {endpoint_id}") from None
    err.write(f"{row.id} {_state(row)}\n")


async def rotate(endpoints: Endpoints, endpoint_id: str, *, out: TextIO, err: TextIO) -> None:
    """A new signing secret alone on stdout; the old one signs beside it for 24 hours."""
    try:
        row, secret = await endpoints.rotate_secret(_id(endpoint_id))
    except EndpointNotFound:
        raise CommandError(f"no endpoint {endpoint_id}") from None
    assert row.previous_secret_expires_at is not None
    err.write(
        f"rotated; the previous secret signs too until "
        f"{row.previous_secret_expires_at.isoformat()}\n"
    )
    out.write(secret + "\n")


async def test(endpoints: Endpoints, endpoint_id: str, *, out: TextIO) -> None:
    """Push a `ping` now; the result as JSON. Fails (status 1) when it was not delivered."""
    try:
        result = await endpoints.test(_id(endpoint_id))
    except EndpointNotFound:
        raise CommandError(f"no endpoint {endpoint_id}") from None
    out.write(json.dumps(result.__dict__) + "\n")
    if not result.delivered:
        raise CommandError(f"the ping was not delivered: {result.error}")


async def replay(
    endpoints: Endpoints, endpoint_id: str, *, since: dt.datetime, out: TextIO
) -> None:
    """Send again every event since `since`; how many, as JSON."""
    try:
        result = await endpoints.replay(_id(endpoint_id), since=since)
    except EndpointNotFound:
        raise CommandError(f"no endpoint {endpoint_id}") from None
    next_since = result.next_since.isoformat() if result.next_since else None
    out.write(json.dumps({"replayed": result.replayed, "next_since": next_since}) + "\n")
