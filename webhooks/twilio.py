"""Twilio message status callbacks and inbound SMS -> normalized events.

Status callbacks post ``MessageSid``, ``MessageStatus`` and, for failures, ``ErrorCode``
(older field names ``SmsSid``/``SmsStatus`` are read as a fallback). The gateway signs its
callback URL with the delivery id in the ``d`` query parameter, so callbacks correlate even
before the send recorded the MessageSid.

Event id: the ``I-Twilio-Idempotency-Token`` header when present (constant across Twilio's
own webhook retries), else the SHA-256 of (MessageSid, MessageStatus, ErrorCode), so a
repeated status is one event.

Inbound SMS: only an exact, case-insensitive whole-body keyword counts (surrounding
whitespace ignored); with Advanced Opt-Out Twilio also sends ``OptOutType`` (STOP, START,
HELP), which wins over our own keyword match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from webhooks.errors import MalformedPayload
from webhooks.events import SMS, TWILIO, UNKNOWN, FeedbackEvent, normalize_recipient
from webhooks.spec import FeedbackSpec

# Every MessageStatus value of the API (twilio-python's enum).
STATUSES = frozenset(
    {
        "queued",
        "sending",
        "sent",
        "failed",
        "delivered",
        "undelivered",
        "receiving",
        "received",
        "accepted",
        "scheduled",
        "read",
        "partially_delivered",
        "canceled",
    }
)

STOP_KEYWORDS = frozenset(
    {"STOP", "UNSUBSCRIBE", "END", "QUIT", "STOPALL", "REVOKE", "OPTOUT", "CANCEL"}
)
START_KEYWORDS = frozenset({"START", "UNSTOP", "YES"})
HELP_KEYWORDS = frozenset({"HELP", "INFO"})

STOP = "stop"
START = "start"
HELP = "help"
INBOUND = "inbound"
DELIVERY_PARAM = "d"


def event_id(params: Mapping[str, str], idempotency_token: str | None) -> str:
    """The dedupe key of one Twilio webhook (see the module docstring)."""
    if idempotency_token and idempotency_token.strip():
        return idempotency_token.strip()
    sid = _sid(params) or ""
    status = params.get("MessageStatus") or params.get("SmsStatus") or ""
    code = params.get("ErrorCode") or ""
    return hashlib.sha256(f"{sid}\x00{status}\x00{code}".encode()).hexdigest()


def parse_status(
    params: Mapping[str, str],
    *,
    query: Mapping[str, str],
    idempotency_token: str | None,
    default_region: str = "US",
) -> FeedbackEvent:
    """One status callback as a normalized event (type = the Twilio status, or unknown)."""
    sid = _sid(params)
    if not sid:
        raise MalformedPayload("status callback without MessageSid")
    status = (params.get("MessageStatus") or params.get("SmsStatus") or "").strip().lower()
    details: dict[str, Any] = {"message_status": status or None}
    code = (params.get("ErrorCode") or "").strip()
    if code:
        details["error_code"] = code[:16]
    for name, key in (("AccountSid", "account_sid"), ("MessagingServiceSid", "service_sid")):
        if params.get(name):
            details[key] = params[name][:64]
    ref = (query.get(DELIVERY_PARAM) or "").strip() or None
    return FeedbackEvent(
        provider=TWILIO,
        provider_event_id=event_id(params, idempotency_token),
        event_type=status if status in STATUSES else UNKNOWN,
        channel=SMS,
        provider_message_id=sid,
        delivery_ref=ref,
        recipient=normalize_recipient(SMS, params.get("To"), default_region),
        occurred_at=None,
        details={k: v for k, v in details.items() if v is not None},
        raw={"params": dict(params), "query": dict(query)},
    )


def opt_action(body: str | None, opt_out_type: str | None) -> tuple[str | None, str | None]:
    """(action, keyword) of an inbound message: stop, start, help or nothing."""
    if opt_out_type and opt_out_type.strip():
        kind = opt_out_type.strip().upper()
        action = {"STOP": STOP, "START": START, "HELP": HELP}.get(kind)
        keyword = (body or "").strip().upper() or kind
        return action, keyword[:32] if action else None
    word = (body or "").strip().upper()
    if word in STOP_KEYWORDS:
        return STOP, word
    if word in START_KEYWORDS:
        return START, word
    if word in HELP_KEYWORDS:
        return HELP, word
    return None, None


def parse_inbound(
    params: Mapping[str, str], *, idempotency_token: str | None, default_region: str = "US"
) -> FeedbackEvent:
    """One inbound SMS as a normalized event; the recipient is the *sender* of the SMS.

    The body itself is not kept in details (it is personal); the raw payload is stored
    encrypted like every other.
    """
    sid = _sid(params)
    if not sid:
        raise MalformedPayload("inbound message without MessageSid")
    action, keyword = opt_action(params.get("Body"), params.get("OptOutType"))
    details: dict[str, Any] = {"action": action, "keyword": keyword}
    if params.get("OptOutType"):
        details["opt_out_type"] = params["OptOutType"].strip().upper()[:16]
    if params.get("AccountSid"):
        details["account_sid"] = params["AccountSid"][:64]
    return FeedbackEvent(
        provider=TWILIO,
        provider_event_id=event_id(params, idempotency_token),
        event_type=INBOUND,
        channel=SMS,
        provider_message_id=sid,
        recipient=normalize_recipient(SMS, params.get("From"), default_region),
        details={k: v for k, v in details.items() if v is not None},
        raw={"params": dict(params)},
    )


def _sid(params: Mapping[str, str]) -> str | None:
    value = (params.get("MessageSid") or params.get("SmsSid") or "").strip()
    return value[:64] or None


def _routes() -> list[Any]:
    from webhooks.api import TWILIO_ROUTES  # the web framework is imported on use only

    return TWILIO_ROUTES


# Twilio's feedback side: status callbacks and inbound SMS (webhooks/api.py), verified by
# `webhooks.twilio_signature.TwilioVerifier` (wired by gateway/services.py), classified by
# `webhooks.classify` from Twilio's one error table (sender/providers/twilio_spec.py).
FEEDBACK = FeedbackSpec(name=TWILIO, channel=SMS, routes=_routes)
