"""The sandbox providers: simulator behaviour and provider-shaped feedback (recorded here)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sender.providers.base import OutgoingMessage
from sender.providers.sandbox import (
    Feedback,
    FeedbackRunner,
    SandboxEmailProvider,
    SandboxSmsProvider,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ses"


class Recorder:
    """A `Feedback` that records what the sandbox hands it."""

    def __init__(self) -> None:
        self.ses: list[tuple[dict[str, Any], str]] = []
        self.twilio: list[tuple[dict[str, str], dict[str, str], str | None]] = []

    async def ses_message(self, message: dict[str, Any], *, event_id: str) -> object:
        self.ses.append((message, event_id))
        return None

    async def twilio_status(
        self, params: Mapping[str, str], *, query: Mapping[str, str], idempotency_token: str | None
    ) -> object:
        self.twilio.append((dict(params), dict(query), idempotency_token))
        return None


def _email(to: str, **extra: Any) -> OutgoingMessage:
    return OutgoingMessage(
        delivery_id=uuid.uuid4(),
        derived_key="d" * 64,
        channel="email",
        to=to,
        sender="sender@example.com",
        subject="Hello",
        text="Hi",
        **extra,
    )


def _sms(to: str, sender: str | None = None) -> OutgoingMessage:
    return OutgoingMessage(
        delivery_id=uuid.uuid4(),
        derived_key="d" * 64,
        channel="sms",
        to=to,
        sender=sender,
        body="Hi",
    )


def test_recorder_is_a_feedback() -> None:
    feedback: Feedback = Recorder()
    assert feedback is not None


@pytest.mark.parametrize(
    ("to", "events"),
    [
        ("success@simulator.amazonses.com", ["Send", "Delivery"]),
        ("bounce@simulator.amazonses.com", ["Send", "Bounce"]),
        ("bounce+campaign7@simulator.amazonses.com", ["Send", "Bounce"]),
        ("ooto@simulator.amazonses.com", ["Send", "Delivery"]),
        ("complaint@simulator.amazonses.com", ["Send", "Delivery", "Complaint"]),
        ("suppressionlist@simulator.amazonses.com", ["Send", "Bounce"]),
        ("anyone@example.com", ["Send", "Delivery"]),
    ],
)
async def test_email_simulator(to: str, events: list[str]) -> None:
    recorder = Recorder()
    runner = FeedbackRunner(recorder, delay=0)
    provider = SandboxEmailProvider(runner, configuration_set="cs")
    message = _email(to)
    outcome = await provider.send(message)
    assert outcome.accepted and outcome.provider == "ses"
    assert recorder.ses == []  # "a moment later", not during the call
    await runner.drain()
    assert runner.pending == 0
    assert [m["eventType"] for m, _ in recorder.ses] == events
    assert len({event_id for _, event_id in recorder.ses}) == len(events)
    for event, _ in recorder.ses:
        mail = event["mail"]
        assert mail["messageId"] == outcome.provider_message_id
        assert mail["destination"] == [to]
        assert mail["tags"]["delivery_id"] == [str(message.delivery_id)]
        assert mail["tags"]["derived_key"] == [message.derived_key]
        assert mail["tags"]["ses:configuration-set"] == ["cs"]
        headers = {h["name"]: h["value"] for h in mail["headers"]}
        assert headers["X-Gateway-Delivery"] == message.derived_key
    last = recorder.ses[-1][0]
    if events[-1] == "Bounce":
        bounce = last["bounce"]
        subtype = "Suppressed" if to.startswith("suppressionlist") else "General"
        assert (bounce["bounceType"], bounce["bounceSubType"]) == ("Permanent", subtype)
        assert [r["emailAddress"] for r in bounce["bouncedRecipients"]] == [to]
    if events[-1] == "Complaint":
        complaint = last["complaint"]
        assert complaint["complaintFeedbackType"] == "abuse"
        assert [r["emailAddress"] for r in complaint["complainedRecipients"]] == [to]
    if events[-1] == "Delivery":
        assert last["delivery"]["recipients"] == [to]


@pytest.mark.parametrize(
    ("kind", "fixture", "sub"),
    [
        ("success", "awsdocs-event-send.json", "send"),
        ("success", "awsdocs-event-delivery.json", "delivery"),
        ("bounce", "awsdocs-event-bounce-permanent-general.json", "bounce"),
        ("complaint", "awsdocs-event-complaint-abuse.json", "complaint"),
    ],
)
async def test_email_events_have_the_shape_of_real_ones(kind: str, fixture: str, sub: str) -> None:
    real = json.loads((FIXTURES / fixture).read_text())
    recorder = Recorder()
    runner = FeedbackRunner(recorder, delay=0)
    await SandboxEmailProvider(runner).send(_email(f"{kind}@simulator.amazonses.com"))
    await runner.drain()
    [ours] = [m for m, _ in recorder.ses if m["eventType"] == real["eventType"]]
    assert set(real) <= set(ours)
    assert set(real["mail"]) <= set(ours["mail"])
    assert set(real["mail"]["commonHeaders"]) <= set(ours["mail"]["commonHeaders"])
    assert set(real[sub]) - {"userAgent"} <= set(ours[sub])
    for key in ("ses:configuration-set", "ses:source-ip", "ses:from-domain", "ses:caller-identity"):
        assert isinstance(ours["mail"]["tags"][key], list)


@pytest.mark.parametrize(
    ("to", "code"),
    [
        ("+15005550001", "21211"),
        ("+15005550002", "21612"),
        ("+15005550003", "21408"),
        ("+15005550004", "21610"),
        ("+15005550009", "21614"),
    ],
)
async def test_twilio_magic_to_numbers(to: str, code: str) -> None:
    recorder = Recorder()
    runner = FeedbackRunner(recorder, delay=0)
    outcome = await SandboxSmsProvider(runner, public_url="https://gw.test").send(_sms(to))
    assert (outcome.error_code, outcome.http_status, outcome.provider) == (code, 400, "twilio")
    assert not outcome.accepted
    await runner.drain()
    assert recorder.twilio == []


@pytest.mark.parametrize(
    ("sender", "code"),
    [("+15005550001", "21212"), ("+15005550007", "21606"), ("+15005550008", "21611")],
)
async def test_twilio_magic_from_numbers(sender: str, code: str) -> None:
    runner = FeedbackRunner(Recorder(), delay=0)
    outcome = await SandboxSmsProvider(runner, public_url="https://gw.test").send(
        _sms("+15005550006", sender=sender)
    )
    assert outcome.error_code == code


@pytest.mark.parametrize("to", ["+15005550006", "+14155552671"])
async def test_twilio_success_posts_status_callbacks(to: str) -> None:
    recorder = Recorder()
    runner = FeedbackRunner(recorder, delay=0)
    message = _sms(to)
    provider = SandboxSmsProvider(runner, public_url="https://gw.test", sms_from="+15017122661")
    outcome = await provider.send(message)
    assert outcome.accepted and (outcome.provider_message_id or "").startswith("SM")
    await runner.drain()
    assert [p["MessageStatus"] for p, _, _ in recorder.twilio] == ["sent", "delivered"]
    for params, query, token in recorder.twilio:
        assert params["MessageSid"] == params["SmsSid"] == outcome.provider_message_id
        assert params["To"] == to and params["From"] == "+15017122661"
        assert params["AccountSid"].startswith("AC") and params["ApiVersion"] == "2010-04-01"
        assert query == {"d": str(message.delivery_id)}
        assert token
    assert len({token for _, _, token in recorder.twilio}) == 2


async def test_without_a_feedback_target_nothing_is_scheduled() -> None:
    runner = FeedbackRunner(None, delay=0)
    outcome = await SandboxEmailProvider(runner).send(_email("bounce@simulator.amazonses.com"))
    assert outcome.accepted and runner.pending == 0


async def test_close_cancels_pending_feedback() -> None:
    recorder = Recorder()
    runner = FeedbackRunner(recorder, delay=60)
    await SandboxEmailProvider(runner).send(_email("success@simulator.amazonses.com"))
    assert runner.pending == 1
    await runner.close()
    assert runner.pending == 0 and recorder.ses == []


async def test_a_failing_feedback_target_does_not_stop_the_rest() -> None:
    class Flaky(Recorder):
        async def ses_message(self, message: dict[str, Any], *, event_id: str) -> object:
            if message["eventType"] == "Send":
                raise RuntimeError("boom")
            return await super().ses_message(message, event_id=event_id)

    recorder = Flaky()
    runner = FeedbackRunner(recorder, delay=0)
    await SandboxEmailProvider(runner).send(_email("success@simulator.amazonses.com"))
    await runner.drain()
    assert [m["eventType"] for m, _ in recorder.ses] == ["Delivery"]


class SlowFeedback(Recorder):
    """Applies Twilio callbacks only once `open` is set (a database that cannot keep up)."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()

    async def twilio_status(
        self, params: Mapping[str, str], *, query: Mapping[str, str], idempotency_token: str | None
    ) -> object:
        await self.open.wait()
        return await super().twilio_status(params, query=query, idempotency_token=idempotency_token)


async def test_sends_wait_while_the_callback_backlog_is_full() -> None:
    feedback = SlowFeedback()
    runner = FeedbackRunner(feedback, delay=0)
    runner.MAX_OVERDUE = 3  # with CONCURRENCY 4 applying: 7 callbacks in flight at most
    provider = SandboxSmsProvider(runner, public_url="https://gw.test")
    for i in range(7):
        assert (await provider.send(_sms(f"+1415555010{i}"))).accepted
    for _ in range(20):  # let every due callback reach the gate
        await asyncio.sleep(0)
    assert runner.overdue == 3
    blocked = asyncio.create_task(provider.send(_sms("+14155550109")))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not blocked.done()  # the send waits for room: the backlog does not grow
    feedback.open.set()
    assert (await blocked).accepted
    await runner.drain()
    assert runner.overdue == 0
    assert len(feedback.twilio) >= 8  # every send's callbacks were applied in the end


class CountingStore:
    """A `MailboxStore` in memory that counts its write statements."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int]] = []

    async def write(self, new: Any, progressed: Any) -> None:
        self.writes.append((len(new), len(progressed)))

    async def pending(self) -> list[Any]:
        return []


async def test_mailbox_writes_of_sends_one_at_a_time_share_a_statement() -> None:
    store = CountingStore()
    runner = FeedbackRunner(None, delay=3600, store=store)
    provider = SandboxSmsProvider(runner, public_url="https://gw.test")
    for i in range(5):  # one at a time, as a single client sends
        assert (await provider.send(_sms(f"+1415555020{i}"))).accepted
        await asyncio.sleep(0)
    await runner.flush()
    assert sum(n for n, _ in store.writes) == 5
    assert len(store.writes) == 1  # not one statement per send
