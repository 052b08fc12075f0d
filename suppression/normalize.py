"""Address normalization, one module for every channel.

Email: trimmed, domain IDNA-encoded and lower-cased; the local part is matched
case-insensitively (we lower-case it for the hash) while the original is kept for sending.
Phone: E.164 via `phonenumbers`, with a default region for national numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import phonenumbers
from email_validator import EmailNotValidError, validate_email

CHANNELS = ("email", "sms")


class InvalidAddress(ValueError):
    """The address is not a valid email address or phone number."""

    def __init__(self, address: str, problem: str) -> None:
        super().__init__(f"{address!r}: {problem}")
        self.address = address
        self.problem = problem


@dataclass(frozen=True)
class Address:
    """A validated address: `key` is what is hashed and matched, `display` what is sent to."""

    channel: str
    key: str
    display: str


def normalize_email(raw: str) -> Address:
    """Validate and normalize an email address (no DNS look-ups)."""
    text = raw.strip()
    try:
        info = validate_email(text, check_deliverability=False, allow_smtputf8=True)
    except EmailNotValidError as exc:
        raise InvalidAddress(raw, str(exc)) from None
    local, _, _ = info.normalized.rpartition("@")
    domain = info.ascii_domain.lower()
    return Address("email", f"{local.lower()}@{domain}", f"{local}@{domain}")


def normalize_phone(raw: str, default_region: str = "US") -> Address:
    """Validate a phone number and format it as E.164."""
    text = raw.strip()
    try:
        number = phonenumbers.parse(text, None if text.startswith("+") else default_region)
    except phonenumbers.NumberParseException as exc:
        raise InvalidAddress(raw, str(exc)) from None
    if not phonenumbers.is_possible_number(number):
        raise InvalidAddress(raw, "not a possible phone number")
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    return Address("sms", e164, e164)


def normalize(channel: str, raw: str, default_region: str = "US") -> Address:
    """Normalize `raw` for `channel` (`email` or `sms`)."""
    if channel == "email":
        return normalize_email(raw)
    if channel == "sms":
        return normalize_phone(raw, default_region)
    raise ValueError(f"unknown channel {channel!r}")
