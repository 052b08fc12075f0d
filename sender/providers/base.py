"""What every send-side provider adapter takes and returns.

An adapter turns one `OutgoingMessage` into exactly one provider call (no retries of its
own) and reports what it saw as a `SendOutcome`; it never raises for provider or transport
errors and never touches the database.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    # Annotations only: provider specs (imported by `sender.classify` for their error
    # tables) name `Provider`, so importing `sender.classify` here would be a cycle.
    from sender.classify import SendOutcome


@dataclass(frozen=True)
class OutgoingMessage:
    """One delivery, ready for the provider: recipient, content and correlation data."""

    delivery_id: uuid.UUID
    derived_key: str
    channel: str
    to: str
    sender: str | None = None
    subject: str | None = None
    text: str | None = None
    html: str | None = None
    body: str | None = None
    reply_to: tuple[str, ...] = ()
    # Extra email headers (e.g. List-Unsubscribe); the adapter adds its correlation header.
    headers: tuple[tuple[str, str], ...] = ()
    category: str = "transactional"
    extra_tags: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """A send-side adapter for one channel."""

    # The provider family as feedback knows it ("ses", "twilio"): used for breaker state,
    # provider message id correlation and the `provider` column.
    name: str
    channel: str

    def limiter_key(self, message: OutgoingMessage) -> str:
        """The rate-limit bucket this message counts against (e.g. "ses", "twilio:<from>")."""
        ...

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """Make exactly one provider call and report its outcome (never raises for errors)."""
        ...

    async def close(self) -> None:
        """Release threads, connections and pending background work."""
        ...


def scrub(text: str | None, *addresses: str) -> str | None:
    """Remove recipient addresses from a provider error text before it is stored.

    Provider messages quote the recipient ("The 'To' number +1500... is not valid"); stored
    errors must not carry addresses in plaintext.
    """
    if text is None:
        return None
    for address in addresses:
        if address:
            text = text.replace(address, "<recipient>")
            text = text.replace(address.lower(), "<recipient>")
    # Anything else that looks like an address or a phone number (other recipients, a
    # differently formatted copy of ours) goes too.
    text = _EMAIL.sub("<address>", text)
    text = _PHONE.sub("<number>", text)
    return text[:1000]


_EMAIL = re.compile(r"[^\s<>()\[\],;:\"']+@[A-Za-z0-9.-]+")
_PHONE = re.compile(r"\+\d[\d ().-]{5,}\d")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date); None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
