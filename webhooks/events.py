"""The normalized provider event: what the parsers produce and the ingestor consumes.

One `FeedbackEvent` per recipient per provider callback. Everything in `details` is
non-personal (bounce type, SMTP status, error code, feedback type, ...): it is stored as
plain JSON. The recipient is kept as a normalized `Address` only in memory: the store keeps
its keyed hash, and `raw` (the payload it came from, which holds addresses) is stored
encrypted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import Any

from sender.reputation import SES_ACCOUNT_SUPPRESSED
from suppression.normalize import Address, InvalidAddress, normalize

SES = "ses"
TWILIO = "twilio"
PROVIDERS = (SES, TWILIO)
EMAIL = "email"
SMS = "sms"

# Event types of SNS itself (recorded, never applied to a delivery).
SUBSCRIPTION_CONFIRMATION = "subscription_confirmation"
UNSUBSCRIBE_CONFIRMATION = "unsubscribe_confirmation"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class FeedbackEvent:
    """One provider fact about one recipient of one provider message.

    `provider_event_id` is unique per provider (the dedupe key). `delivery_ref` is the
    delivery id or derived key the gateway attached to the send (SES tag/header, Twilio
    callback URL parameter), when the payload carries it.
    """

    provider: str
    provider_event_id: str
    event_type: str
    channel: str
    provider_message_id: str | None = None
    delivery_ref: str | None = None
    recipient: Address | None = None
    occurred_at: dt.datetime | None = None
    details: dict[str, Any] = field(default_factory=dict)
    raw: Any = None

    @property
    def error_code(self) -> str | None:
        """The provider error code or SMTP status carried by the event, if any.

        A bounce or complaint SES produced itself because the address is on the account's
        suppression list gives its subtype instead: SES does not count those toward the
        bounce and complaint rates, and the reputation guard (sender.reputation) tells them
        apart by this code on the attempt."""
        d = self.details
        if SES_ACCOUNT_SUPPRESSED in (d.get("bounce_subtype"), d.get("complaint_subtype")):
            return SES_ACCOUNT_SUPPRESSED
        value = d.get("error_code") or d.get("status")
        return str(value) if value else None


# A surrogate left in a decoded string is a lone one (JSON's `\ud800`): no UTF-8 text can
# hold it, so it is stored as U+FFFD.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value.replace("\x00", ""))
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def storable(event: FeedbackEvent) -> FeedbackEvent:
    """`event` with U+0000 removed (and lone surrogates replaced by U+FFFD) from everything
    stored as text or JSON.

    PostgreSQL text and jsonb cannot hold NUL, and a JSON payload or a form field may carry
    it (``\u0000``, ``%00``); left in, it would fail the insert on every retry of the
    provider (a 503 forever) instead of being stored. `raw` is kept as it is: it is stored
    as ciphertext of its JSON, where NUL is escaped.
    """
    return dataclasses.replace(
        event,
        provider_event_id=_without_nul(event.provider_event_id),
        event_type=_without_nul(event.event_type),
        provider_message_id=_without_nul(event.provider_message_id),
        delivery_ref=_without_nul(event.delivery_ref),
        details=_without_nul(event.details),
    )


def parse_time(value: Any) -> dt.datetime | None:
    """An aware UTC datetime from an ISO 8601 string (SES/SNS style), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        return parsed.astimezone(dt.UTC)
    except (ValueError, OverflowError):  # OverflowError: year 1 or 9999 with an offset
        return None


def normalize_recipient(channel: str, raw: Any, default_region: str = "US") -> Address | None:
    """Normalize an address found in a payload; None when it is absent or unusable.

    Email addresses may come with a display name (``"Jane" <jane@example.com>``).
    """
    if not isinstance(raw, str) or not raw.strip():
        return None
    text = raw.strip()
    if channel == EMAIL:
        text = parseaddr(text)[1] or text
    try:
        return normalize(channel, text, default_region)
    except InvalidAddress:
        return None


_EMAIL_RE = re.compile(r"[^\s<>\"'(),;:]+@[^\s<>\"'(),;:]+")
_PHONE_RE = re.compile(r"\+\d[\d\s().-]{6,}\d")


def redact(text: Any, limit: int = 300) -> str | None:
    """A provider diagnostic with anything that looks like an address or number removed.

    Diagnostic codes quote the recipient ("550 5.1.1 <jane@example.com>... User unknown");
    stored details must not.
    """
    if not isinstance(text, str) or not text:
        return None
    cleaned = _PHONE_RE.sub("[number]", _EMAIL_RE.sub("[address]", text))
    return cleaned[:limit]
