"""Address normalization, one module for every channel.

Email: trimmed, domain IDNA-encoded and lower-cased; the local part is matched
case-insensitively (we lower-case it for the hash) while the original is kept for sending.
Phone: E.164 via `phonenumbers`, with a default region for national numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import phonenumbers
from email_validator import SPECIAL_USE_DOMAIN_NAMES, EmailNotValidError, validate_email

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


# Plain ASCII addresses (dot-atom local part of letters, digits, `_+-`; LDH domain labels),
# which are nearly all of them, are recognized here in ~1 us instead of ~35 us in
# `email_validator`. The checks below are those `email_validator` applies to such an address
# (lengths, a dot in the domain, a TLD ending in a letter, no special-use domain, no `--`
# label rule); anything else, and every invalid address, goes through `email_validator`, so
# results and error messages are the same (tests/suppression/test_normalize.py).
_SIMPLE_EMAIL = re.compile(
    r"([A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*)"
    r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
)
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")
_SPECIAL_USE = tuple(SPECIAL_USE_DOMAIN_NAMES)


def _simple_email(text: str) -> Address | None:
    match = _SIMPLE_EMAIL.fullmatch(text)
    if match is None:
        return None
    local, domain = match.group(1), match.group(2).lower()
    if len(local) > 64 or len(text) > 254 or len(domain) > 253 or "--" in domain:
        return None
    if domain[-1] not in _ASCII_LETTERS:
        return None
    for special in _SPECIAL_USE:
        if domain == special or domain.endswith("." + special):
            return None
    return Address("email", f"{local.lower()}@{domain}", f"{local}@{domain}")


def normalize_email(raw: str) -> Address:
    """Validate and normalize an email address (no DNS look-ups)."""
    text = raw.strip()
    simple = _simple_email(text)
    if simple is not None:
        return simple
    try:
        info = validate_email(text, check_deliverability=False, allow_smtputf8=True)
    except EmailNotValidError as exc:
        raise InvalidAddress(raw, str(exc)) from None
    local, _, _ = info.normalized.rpartition("@")
    domain = info.ascii_domain.lower()
    return Address("email", f"{local.lower()}@{domain}", f"{local}@{domain}")


# E.164 numbers of the North American Numbering Plan (+1, then ten digits whose area code
# starts with 2-9): what `phonenumbers.parse` makes of them is known without running it
# (country code 1, the ten digits as the national number; the plan's national prefix "1"
# cannot begin an area code, so nothing is stripped), and parse is about half the cost of a
# strict check. Possibility and validity are still phonenumbers' own checks, so results and
# error messages are the same (tests/suppression/test_normalize.py compares with parse).
_NANP_E164 = re.compile(r"\+1[2-9][0-9]{9}")


def normalize_phone(raw: str, default_region: str = "US", *, strict: bool = False) -> Address:
    """Validate a phone number and format it as E.164.

    Every number must be possible (a plausible length); with `strict` it must also be valid
    (`phonenumbers.is_valid_number`: a length and range its country assigns), which is what
    new input (a send, a manual suppression, a check) is held to. Look-ups of stored data and
    numbers reported by a provider (an inbound STOP) stay lenient: a number that newer
    metadata no longer knows must still be found and suppressed. Twilio's test numbers
    (+1 500-555-xxxx, the sandbox's magic numbers) are valid numbers for `phonenumbers`.
    """
    text = raw.strip()
    national = not text.startswith("+")
    if _NANP_E164.fullmatch(text):
        number = phonenumbers.PhoneNumber(country_code=1, national_number=int(text[2:]))
    else:
        try:
            number = phonenumbers.parse(text, default_region if national else None)
        except phonenumbers.NumberParseException as exc:
            raise InvalidAddress(raw, str(exc)) from None
    if not phonenumbers.is_possible_number(number):
        raise InvalidAddress(raw, "not a possible phone number")
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    if strict and not phonenumbers.is_valid_number(number):
        raise InvalidAddress(raw, _invalid_reason(e164, number, default_region, national))
    return Address("sms", e164, e164)


def _invalid_reason(
    e164: str, number: phonenumbers.PhoneNumber, default_region: str, national: bool
) -> str:
    regions = phonenumbers.region_codes_for_country_code(number.country_code or 0)
    where = f"country code +{number.country_code} ({', '.join(regions[:3]) or 'unknown'})"
    reason = f"{e164} is not a valid number for {where}: wrong length or an unassigned range"
    if national:
        reason += (
            f"; without a leading + it was read as a national number of {default_region}"
            " (GATEWAY_DEFAULT_REGION): give the number in E.164, +<country code><number>"
        )
    return reason


def normalize(
    channel: str, raw: str, default_region: str = "US", *, strict: bool = False
) -> Address:
    """Normalize `raw` for `channel` (`email` or `sms`); `strict`: see `normalize_phone`."""
    if channel == "email":
        return normalize_email(raw)
    if channel == "sms":
        return normalize_phone(raw, default_region, strict=strict)
    raise ValueError(f"unknown channel {channel!r}")
