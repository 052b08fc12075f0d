"""The worker's dispatch reads its delivery and the suppression verdict in one statement
(`sender.log.dispatchable`): the verdict is the one `suppression.check` gives."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from sender import log as dlog
from suppression import service as suppression
from suppression.db import pg_connection, utcnow
from suppression.normalize import normalize
from tests.sender.helpers import Gateway, sms

ASYNC = {"Prefer": "respond-async"}


@pytest.mark.parametrize(
    ("category", "topic", "entry_scope", "expires_in"),
    [
        ("marketing", "news", "news", None),
        ("marketing", "deals", "news", None),
        ("transactional", "news", "news", None),
        ("transactional", None, "all", None),
        ("marketing", "news", "all", None),
        ("marketing", "news", "all", -60),  # expired: stops nothing
        ("marketing", "news", "news", 3600),
    ],
)
async def test_the_read_verdict_is_the_suppression_check(
    providers_gateway: Gateway,
    category: str,
    topic: str | None,
    entry_scope: str,
    expires_in: int | None,
) -> None:
    gw = providers_gateway
    number = "+14155550600"
    body = sms([number], category=category, **({"topic": topic} if topic else {}))
    accepted = await gw.send(body, headers=ASYNC)
    assert accepted.status_code == 202, accepted.text
    delivery_id = uuid.UUID(accepted.json()["deliveries"][0]["id"])
    # The entry is added after acceptance: the dispatch is what must see it.
    async with gw.services.sessions() as session:
        await suppression.add(
            session,
            gw.services.protector,
            normalize("sms", number),
            reason="manual",
            scope=entry_scope,
            source=suppression.Source(type="test"),
            expires_at=(
                utcnow() + dt.timedelta(seconds=expires_in) if expires_in is not None else None
            ),
        )
        await session.commit()
    now = utcnow()
    async with pg_connection(gw.services.engine) as conn:
        found = await dlog.dispatchable(conn, delivery_id, now)
        assert found is not None and found.delivery.id == delivery_id
        expected = await suppression.check(
            conn,
            "sms",
            found.delivery.recipient_hash,
            category=category,
            topic=found.delivery.topic,
            now=now,
        )
    if expected is None:
        assert found.hit is None
    else:
        assert found.hit == (expected.id, expected.reason, expected.scope)
    stopped = expires_in != -60 and (
        entry_scope == "all" or (category != "transactional" and topic == entry_scope)
    )
    assert (found.hit is not None) == stopped
