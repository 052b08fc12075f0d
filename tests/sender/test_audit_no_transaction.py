"""Audit (DESIGN flow 1): the attempt row is committed `in_progress` before the provider
call, and no transaction or row lock is held while the call is under way."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import select, text

from sender.models import Attempt, Delivery, Message
from tests.sender.helpers import Gateway, email, sms
from tests.stubs._server import Behavior, StubServer
from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import TwilioStub

# Backends of the test database (other than the asking one) that are inside a transaction.
_OPEN_TRANSACTIONS = text(
    "SELECT pid, state, query FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend' AND xact_start IS NOT NULL"
)


@pytest.mark.parametrize("channel", ["email", "sms"])
async def test_nothing_is_held_open_across_the_provider_call(
    providers_gateway: Gateway, ses_stub: SesStub, twilio_stub: TwilioStub, channel: str
) -> None:
    gw = providers_gateway
    stub: StubServer = ses_stub if channel == "email" else twilio_stub
    body: dict[str, Any] = email("held@example.com") if channel == "email" else sms("+14155552671")
    answer = threading.Event()
    stub.then(Behavior.accept(hold=answer))
    request = asyncio.create_task(gw.send(body))
    try:
        assert await asyncio.to_thread(stub.received.wait, 20), "the provider was not called"
        async with gw.services.sessions() as session:
            # Committed before the call: visible from another connection while it runs.
            attempt = (await session.scalars(select(Attempt))).one()
            assert attempt.status == "in_progress" and attempt.finished_at is None
            delivery = await session.get(Delivery, attempt.delivery_id)
            assert delivery is not None and delivery.status == "sending"
            # No transaction of the gateway is open, so no row lock either.
            assert (await session.execute(_OPEN_TRANSACTIONS)).all() == []
            await session.execute(
                select(Delivery.id).where(Delivery.id == delivery.id).with_for_update(nowait=True)
            )
            await session.execute(
                select(Message.id)
                .where(Message.id == delivery.message_id)
                .with_for_update(nowait=True)
            )
            await session.rollback()
        assert not request.done()  # the call really was still under way
    finally:
        answer.set()
        # Let the send finish even when a check failed, so the test ends cleanly.
        response = await asyncio.wait_for(request, 30)
    assert response.status_code == 201, response.text
    assert response.json()["deliveries"][0]["status"] == "sent"
    assert stub.count == 1
