"""Idempotency-Key parsing, request fingerprints and per-delivery derived keys (pure code)."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from suppression.crypto import AddressProtector

MAX_KEY_LENGTH = 255

# Bare (unquoted) keys: RFC 8941 token characters. Strictly an sf-token must start with a
# letter or "*", but bare UUIDs (which start with a digit) are what clients send in practice.
_BARE = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~:/-]+")
# What the OpenAPI document states: a bare token, or an sf-string (printable ASCII, `"` and
# `\` escaped) of 1-255 characters.
IDEMPOTENCY_KEY_PATTERN = (
    r"^(?:[A-Za-z0-9!#$%&'*+.^_`|~:/-]{1,255}"
    r'|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\]){1,255}")$'
)


class InvalidIdempotencyKey(ValueError):
    """The header is missing or not a valid key; the message says why."""


def parse_idempotency_key(raw: str | None) -> str:
    """Decode the `Idempotency-Key` header (an sf-string; bare tokens are accepted too).

    Returns the key itself (without quotes or escapes). Keys are 1-255 printable ASCII
    characters.
    """
    if raw is None:
        raise InvalidIdempotencyKey("the Idempotency-Key header is required")
    text = raw.strip(" \t")
    if not text:
        raise InvalidIdempotencyKey("the Idempotency-Key header is empty")
    if text.startswith('"'):
        key = _parse_sf_string(text)
    elif _BARE.fullmatch(text):
        key = text
    else:
        raise InvalidIdempotencyKey(
            "the Idempotency-Key must be a quoted string or a bare token of letters, digits "
            "and -._~:/+*!#$%&'^`|"
        )
    if not key:
        raise InvalidIdempotencyKey("the Idempotency-Key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(
            f"the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters"
        )
    return key


def _parse_sf_string(text: str) -> str:
    # RFC 8941 section 4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, where the
    # characters are printable ASCII (0x20-0x7E). Nothing may follow but whitespace.
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            if i + 1 >= len(text) or text[i + 1] not in '"\\':
                raise InvalidIdempotencyKey("invalid escape in the quoted Idempotency-Key")
            out.append(text[i + 1])
            i += 2
            continue
        if ch == '"':
            if text[i + 1 :].strip(" \t"):
                raise InvalidIdempotencyKey(
                    "unexpected characters after the quoted Idempotency-Key"
                )
            return "".join(out)
        if not (0x20 <= ord(ch) <= 0x7E):
            raise InvalidIdempotencyKey("the Idempotency-Key may contain printable ASCII only")
        out.append(ch)
        i += 1
    raise InvalidIdempotencyKey("the quoted Idempotency-Key is not terminated")


def canonical_json(value: Any) -> str:
    """A canonical JSON text: sorted keys, no insignificant whitespace, UTF-8 kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(body: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of a request body."""
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def derived_key(
    protector: AddressProtector,
    client_id: uuid.UUID,
    idempotency_key: str,
    channel: str,
    normalized_recipient: str,
) -> str:
    """H(client, Idempotency-Key, channel, normalized recipient): HMAC-SHA256 hex, server key.

    It is computed through the protector's keyed hash (domain-separated by the `derived`
    pseudo-channel), so it uses the same server secret without exposing it. The value is 64
    hex characters: valid as an SES tag value and in URLs.
    """
    material = "\x00".join((str(client_id), idempotency_key, channel, normalized_recipient))
    return protector.hash("derived", material)
