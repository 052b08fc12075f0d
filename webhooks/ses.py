"""SES notifications and configuration-set event publishing -> normalized events.

Both shapes arrive as the JSON string inside an SNS ``Message``:

* identity notifications say ``notificationType`` (Bounce, Complaint, Delivery);
* event publishing says ``eventType`` (Send, Delivery, Bounce, Complaint, Reject,
  DeliveryDelay, Open, Click, ``Rendering Failure`` with a space, Subscription).

The type-specific object is keyed in lower camel case (``bounce``, ``deliveryDelay``, and
``failure`` for Rendering Failure). SES adds fields without notice, so unknown keys are
ignored and unknown types become one event of type ``unknown``.

One event per recipient: a bounce or complaint can list several. The event id is the SNS
MessageId; when a notification lists several recipients, each gets ``<MessageId>#<n>``
with ``n`` the recipient's position (from 0) in the list SES sent, so an SNS redelivery
maps to the same ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from webhooks.errors import MalformedPayload
from webhooks.events import (
    EMAIL,
    SES,
    UNKNOWN,
    FeedbackEvent,
    normalize_recipient,
    parse_time,
    redact,
)
from webhooks.spec import FeedbackSpec

# SES type name -> (normalized event type, key of its type-specific object).
SES_TYPES: dict[str, tuple[str, str]] = {
    "Send": ("send", "send"),
    "Delivery": ("delivery", "delivery"),
    "Bounce": ("bounce", "bounce"),
    "Complaint": ("complaint", "complaint"),
    "Reject": ("reject", "reject"),
    "Rendering Failure": ("rendering_failure", "failure"),
    "DeliveryDelay": ("delivery_delay", "deliveryDelay"),
    "Open": ("open", "open"),
    "Click": ("click", "click"),
    "Subscription": ("subscription", "subscription"),
}

# The email tag and header the send path attaches so that feedback correlates even when the
# provider message id was never recorded (see DESIGN "Derived key").
DELIVERY_TAG = "delivery_id"
DELIVERY_HEADER = "x-gateway-delivery"


def parse_notification(
    message: Mapping[str, Any], *, event_id: str, default_region: str = "US"
) -> list[FeedbackEvent]:
    """Every normalized event in one SES notification (at least one)."""
    if not isinstance(message, Mapping):
        raise MalformedPayload("SES notification is not a JSON object")
    kind = message.get("eventType") or message.get("notificationType")
    mail = _mapping(message.get("mail"))
    event_type, body_key = (
        SES_TYPES.get(kind, (UNKNOWN, ""))
        if isinstance(kind, str)
        else (
            UNKNOWN,
            "",
        )
    )
    body = _mapping(message.get(body_key)) if body_key else {}
    provider_message_id = _str(mail.get("messageId"))
    common: dict[str, Any] = {"ses_type": kind if isinstance(kind, str) else None}
    occurred = parse_time(body.get("timestamp")) or parse_time(mail.get("timestamp"))
    recipients = _recipients(event_type, body, mail)
    common.update(_type_details(event_type, body))
    events: list[FeedbackEvent] = []
    several = len(recipients) > 1
    for index, (address, per_recipient) in enumerate(recipients):
        details = {**common, **per_recipient}
        recipient = normalize_recipient(EMAIL, address, default_region)
        if address is not None and recipient is None:
            details["recipient_unusable"] = True
        events.append(
            FeedbackEvent(
                provider=SES,
                provider_event_id=f"{event_id}#{index}" if several else event_id,
                event_type=event_type,
                channel=EMAIL,
                provider_message_id=provider_message_id,
                delivery_ref=delivery_ref(mail),
                recipient=recipient,
                occurred_at=occurred,
                details=details,
                raw=dict(message),
            )
        )
    return events


def delivery_ref(mail: Mapping[str, Any]) -> str | None:
    """The delivery id tag, else the correlation header the send path set, if present.

    Tags exist only with configuration-set event publishing; headers may be truncated
    (``headersTruncated``), so either can be missing.
    """
    tags = _mapping(mail.get("tags"))
    values = tags.get(DELIVERY_TAG)
    if isinstance(values, list) and values and isinstance(values[0], str) and values[0]:
        return values[0]
    headers = mail.get("headers")
    if isinstance(headers, list):
        for header in headers:
            if (
                isinstance(header, Mapping)
                and isinstance(header.get("name"), str)
                and header["name"].lower() == DELIVERY_HEADER
                and isinstance(header.get("value"), str)
                and header["value"].strip()
            ):
                return str(header["value"]).strip()
    return None


def _recipients(
    event_type: str, body: Mapping[str, Any], mail: Mapping[str, Any]
) -> list[tuple[str | None, dict[str, Any]]]:
    listed: list[tuple[str | None, dict[str, Any]]] = []
    if event_type == "bounce":
        listed = [_recipient_entry(r) for r in _list(body.get("bouncedRecipients"))]
    elif event_type == "complaint":
        listed = [_recipient_entry(r) for r in _list(body.get("complainedRecipients"))]
    elif event_type == "delivery_delay":
        listed = [_recipient_entry(r) for r in _list(body.get("delayedRecipients"))]
    elif event_type == "delivery":
        listed = [(r, {}) for r in _list(body.get("recipients")) if isinstance(r, str)]
    destination: list[tuple[str | None, dict[str, Any]]] = [
        (r, {}) for r in _list(mail.get("destination")) if isinstance(r, str)
    ]
    if event_type in ("open", "click"):
        # SES does not say which recipient opened; only a single destination is certain.
        return destination if len(destination) == 1 else [(None, {})]
    if event_type == UNKNOWN:
        return [(None, {})]
    return listed or destination or [(None, {})]


def _recipient_entry(entry: Any) -> tuple[str | None, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if not isinstance(entry, Mapping):
        return None, {}
    details: dict[str, Any] = {}
    status = _str(entry.get("status"))
    if status:
        details["status"] = status[:32]
    action = _str(entry.get("action"))
    if action:
        details["action"] = action[:32]
    diagnostic = redact(entry.get("diagnosticCode"))
    if diagnostic:
        details["diagnostic"] = diagnostic
    return _str(entry.get("emailAddress")), details


def _type_details(event_type: str, body: Mapping[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if event_type == "bounce":
        details["bounce_type"] = _str(body.get("bounceType"))
        details["bounce_subtype"] = _str(body.get("bounceSubType"))
        details["feedback_id"] = _str(body.get("feedbackId"))
    elif event_type == "complaint":
        details["feedback_type"] = _str(body.get("complaintFeedbackType"))
        details["complaint_subtype"] = _str(body.get("complaintSubType"))
        details["feedback_id"] = _str(body.get("feedbackId"))
    elif event_type == "delivery_delay":
        details["delay_type"] = _str(body.get("delayType"))
        details["expiration_time"] = _str(body.get("expirationTime"))
    elif event_type == "delivery":
        details["smtp_response"] = redact(body.get("smtpResponse"))
    elif event_type == "reject":
        details["reason"] = redact(body.get("reason"))
    elif event_type == "rendering_failure":
        details["template"] = _str(body.get("templateName"))
        details["error"] = redact(body.get("errorMessage"))
    elif event_type == "subscription":
        details.update(_subscription_details(body))
    return {key: value for key, value in details.items() if value is not None}


def _subscription_details(body: Mapping[str, Any]) -> dict[str, Any]:
    new = _mapping(body.get("newTopicPreferences"))
    topics = []
    for entry in _list(new.get("topicSubscriptionStatus")):
        if isinstance(entry, Mapping) and isinstance(entry.get("topicName"), str):
            topics.append(
                {
                    "topic": entry["topicName"],
                    "status": _str(entry.get("subscriptionStatus")) or "",
                }
            )
    return {
        "contact_list": _str(body.get("contactList")),
        "source": _str(body.get("source")),
        "unsubscribe_all": new.get("unsubscribeAll") is True,
        "topics": topics,
    }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _routes() -> list[Any]:
    from webhooks.api import SES_ROUTES  # the web framework is imported on use only

    return SES_ROUTES


# SES's feedback side: the SNS endpoint (webhooks/api.py), verified by `webhooks.sns`
# (wired by gateway/services.py), classified by `webhooks.classify` from SES's one table of
# conditions (sender/providers/ses_spec.py).
FEEDBACK = FeedbackSpec(name="ses", channel="email", routes=_routes)
