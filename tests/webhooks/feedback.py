"""Helpers for the feedback-processing tests: fixture payloads, variants, delivery rows."""

from __future__ import annotations

import copy
import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from sqlalchemy import select

from gateway.services import Services
from sender.models import Attempt, Delivery, Message
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import normalize
from webhooks.models import ProviderEvent

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SES_FIXTURES = FIXTURES / "ses"
TWILIO_PAYLOADS = FIXTURES / "twilio" / "payloads"
PHONE = "+15005550006"
"""The SMS recipient of the feedback tests (a Twilio test number)."""

# Every SES fixture: file -> (normalized event type, number of recipient events).
SES_FILES: dict[str, tuple[str, int]] = {
    "aerendir-real-notification-bounce-permanent-suppressed-simulator.json": ("bounce", 1),
    "awsdocs-event-bounce-permanent-general.json": ("bounce", 1),
    "awsdocs-event-click.json": ("click", 1),
    "awsdocs-event-complaint-abuse.json": ("complaint", 1),
    "awsdocs-event-delivery.json": ("delivery", 1),
    "awsdocs-event-deliverydelay.json": ("delivery_delay", 1),
    "awsdocs-event-open.json": ("open", 1),
    "awsdocs-event-reject.json": ("reject", 1),
    "awsdocs-event-rendering-failure.json": ("rendering_failure", 1),
    "awsdocs-event-send.json": ("send", 1),
    "awsdocs-event-subscription.json": ("subscription", 1),
    "awsdocs-notification-bounce-permanent-general-no-dsn.json": ("bounce", 2),
    "awsdocs-notification-bounce-permanent-general-with-dsn.json": ("bounce", 1),
    "awsdocs-notification-complaint-abuse-with-feedback.json": ("complaint", 1),
    "awsdocs-notification-complaint-no-feedback.json": ("complaint", 1),
    "awsdocs-notification-delivery.json": ("delivery", 1),
    "djangoses-real-event-complaint-abuse-simulator.json": ("complaint", 1),
    "djangoses-real-notification-bounce-permanent-general-simulator.json": ("bounce", 1),
    "lambdalocal-notification-delivery.json": ("delivery", 1),
}


def ses_payload(name: str) -> dict[str, Any]:
    """A genuine SES payload from the fixtures (a fresh copy)."""
    loaded: dict[str, Any] = json.loads((SES_FIXTURES / name).read_text())
    return loaded


def ses_event(
    kind: str,
    *,
    message_id: str,
    recipients: Sequence[str] = ("jane@example.com",),
    delivery_ref: str | None = None,
    shape: str = "event",
    bounce_type: str = "Permanent",
    bounce_subtype: str = "General",
    status: str | None = "5.1.1",
    feedback_type: str | None = "abuse",
) -> dict[str, Any]:
    """An SES payload of `kind` built from a genuine example, for `recipients`.

    `shape` is "event" (configuration-set event publishing, `eventType`) or "notification"
    (identity notifications, `notificationType`). Only the fields the tests vary are
    changed; everything else is the AWS docs' example.
    """
    base_file = {
        "Send": "awsdocs-event-send.json",
        "Delivery": "awsdocs-event-delivery.json",
        "Bounce": "awsdocs-event-bounce-permanent-general.json",
        "Complaint": "awsdocs-event-complaint-abuse.json",
        "Reject": "awsdocs-event-reject.json",
        "DeliveryDelay": "awsdocs-event-deliverydelay.json",
        "Open": "awsdocs-event-open.json",
        "Click": "awsdocs-event-click.json",
        "Rendering Failure": "awsdocs-event-rendering-failure.json",
        "Subscription": "awsdocs-event-subscription.json",
    }[kind]
    payload = copy.deepcopy(ses_payload(base_file))
    mail = payload["mail"]
    mail["messageId"] = message_id
    mail["destination"] = list(recipients)
    mail.setdefault("tags", {})
    if delivery_ref is not None:
        mail["tags"]["delivery_id"] = [delivery_ref]
    else:
        mail["tags"].pop("delivery_id", None)
    if kind == "Bounce":
        payload["bounce"]["bounceType"] = bounce_type
        payload["bounce"]["bounceSubType"] = bounce_subtype
        entries = []
        for r in recipients:
            entry: dict[str, Any] = {"emailAddress": r, "action": "failed"}
            if status is not None:
                entry["status"] = status
                entry["diagnosticCode"] = f"smtp; 550 {status} <{r}>... User unknown"
            entries.append(entry)
        payload["bounce"]["bouncedRecipients"] = entries
    elif kind == "Complaint":
        payload["complaint"]["complainedRecipients"] = [{"emailAddress": r} for r in recipients]
        if feedback_type is None:
            payload["complaint"].pop("complaintFeedbackType", None)
        else:
            payload["complaint"]["complaintFeedbackType"] = feedback_type
    elif kind == "Delivery":
        payload["delivery"]["recipients"] = list(recipients)
    elif kind == "DeliveryDelay":
        payload["deliveryDelay"]["delayedRecipients"] = [
            {"emailAddress": r, "status": "4.4.1", "diagnosticCode": "smtp; 421 4.4.1"}
            for r in recipients
        ]
    if shape == "notification":
        payload["notificationType"] = payload.pop("eventType")
        mail.pop("tags", None)
    return payload


def twilio_form(name: str) -> dict[str, str]:
    """A form body from the Twilio fixtures as a dict (blank values kept)."""
    text = (TWILIO_PAYLOADS / name).read_text().strip()
    return dict(parse_qsl(text, keep_blank_values=True))


def twilio_status_bodies() -> list[dict[str, Any]]:
    """The 12 status-callback bodies of the VA fixture."""
    items: list[dict[str, Any]] = json.loads(
        (TWILIO_PAYLOADS / "va-status-callback-bodies.json").read_text()
    )["items"]
    return items


def status_params(
    sid: str, status: str, *, to: str = "+15005550006", error_code: str | None = None
) -> dict[str, str]:
    """A status callback body shaped like the fixture's, for one message."""
    params = dict(twilio_status_bodies()[5]["params"])  # the "delivered" body
    params.update(
        {"MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status, "To": to}
    )
    params["AccountSid"] = "AC" + "0" * 32
    if error_code is not None:
        params["ErrorCode"] = error_code
    return params


# ---- database rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    """A delivery created for a test, with the ids of its attempts."""

    delivery_id: uuid.UUID
    attempt_ids: tuple[uuid.UUID, ...]
    recipient_hash: str


async def make_delivery(
    services: Services,
    *,
    channel: str = "email",
    to: str = "jane@example.com",
    status: str = "sent",
    attempts: Sequence[tuple[str, str | None]] = (("accepted", "pmid-1"),),
    provider: str | None = None,
    category: str = "transactional",
    topic: str | None = None,
    expires_at: dt.datetime | None = None,
    next_attempt_at: dt.datetime | None = None,
    delivery_pmid: str | None = None,
) -> Made:
    """A message, its delivery and attempts `(status, provider message id)` in order."""
    provider = provider or ("ses" if channel == "email" else "twilio")
    address = normalize(channel, to)
    recipient_hash = services.protector.hash(channel, address.key)
    async with services.sessions() as session:
        message = Message(
            client_id=uuid.uuid4(),
            idempotency_key=uuid.uuid4().hex,
            fingerprint="0" * 64,
            state="completed",
            channel=channel,
            category=category,
            topic=topic,
        )
        session.add(message)
        await session.flush()
        last_pmid = next((p for _, p in reversed(attempts) if p), None)
        delivery = Delivery(
            message_id=message.id,
            channel=channel,
            recipient_hash=recipient_hash,
            recipient_encrypted=services.protector.encrypt(address.key),
            derived_key=uuid.uuid4().hex,
            status=status,
            provider=provider,
            provider_message_id=delivery_pmid if delivery_pmid is not None else last_pmid,
            category=category,
            topic=topic,
            expires_at=expires_at,
            attempts=len(attempts),
            next_attempt_at=next_attempt_at,
        )
        session.add(delivery)
        await session.flush()
        rows = []
        for number, (attempt_status, pmid) in enumerate(attempts, start=1):
            row = Attempt(
                delivery_id=delivery.id,
                number=number,
                status=attempt_status,
                provider=provider,
                provider_message_id=pmid,
            )
            session.add(row)
            rows.append(row)
        await session.flush()
        made = Made(delivery.id, tuple(r.id for r in rows), recipient_hash)
        await session.commit()
    return made


async def delivery_state(
    services: Services, delivery_id: uuid.UUID
) -> tuple[Delivery, list[Attempt]]:
    """The delivery and its attempts (fresh from the database)."""
    async with services.sessions() as session:
        delivery = await session.get(Delivery, delivery_id)
        assert delivery is not None
        attempts = list(
            await session.scalars(
                select(Attempt).where(Attempt.delivery_id == delivery_id).order_by(Attempt.number)
            )
        )
        return delivery, attempts


async def stored_events(services: Services) -> list[ProviderEvent]:
    """Every stored provider event, oldest first."""
    async with services.sessions() as session:
        return list(
            await session.scalars(
                select(ProviderEvent).order_by(ProviderEvent.received_at, ProviderEvent.id)
            )
        )


async def suppressions(services: Services) -> list[Suppression]:
    """Every suppression entry."""
    async with services.sessions() as session:
        return list(await session.scalars(select(Suppression).order_by(Suppression.created_at)))


async def history(services: Services) -> list[SuppressionHistory]:
    """The suppression history, in order."""
    async with services.sessions() as session:
        return list(
            await session.scalars(select(SuppressionHistory).order_by(SuppressionHistory.id))
        )


def hash_of(services: Services, channel: str, address: str) -> str:
    """The keyed hash of a (raw) address."""
    return services.protector.hash(channel, normalize(channel, address).key)
