"""Idempotency-Key parsing, body fingerprints and derived keys (pure)."""

from __future__ import annotations

import re
import uuid

import pytest
from cryptography.fernet import Fernet
from hypothesis import given
from hypothesis import strategies as st

from sender.keys import (
    MAX_KEY_LENGTH,
    InvalidIdempotencyKey,
    derived_key,
    fingerprint,
    parse_idempotency_key,
)
from suppression.crypto import AddressProtector


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('  "spaced key"  ', "spaced key"),
        ('"with \\"quote\\" and \\\\"', 'with "quote" and \\'),
        ("token:with/slash+plus*", "token:with/slash+plus*"),
        ('"' + "k" * MAX_KEY_LENGTH + '"', "k" * MAX_KEY_LENGTH),
    ],
)
def test_valid_keys(header: str, key: str) -> None:
    assert parse_idempotency_key(header) == key


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        '""',
        '"open',
        '"bad escape \\n"',
        '"trailing" junk',
        '"non-ascii é"',
        '"tab\there"',
        "two words",
        "semi;colon",
        "comma,separated",
        '"' + "k" * (MAX_KEY_LENGTH + 1) + '"',
        "k" * (MAX_KEY_LENGTH + 1),
    ],
)
def test_invalid_keys(header: str | None) -> None:
    with pytest.raises(InvalidIdempotencyKey):
        parse_idempotency_key(header)


@given(
    st.text(
        alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255
    )
)
def test_any_printable_key_round_trips_as_an_sf_string(key: str) -> None:
    quoted = '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert parse_idempotency_key(quoted) == key


def test_fingerprint_is_canonical() -> None:
    a = {"channel": "sms", "to": ["+1"], "metadata": {"b": "2", "a": "1"}}
    b = {"metadata": {"a": "1", "b": "2"}, "to": ["+1"], "channel": "sms"}
    assert fingerprint(a) == fingerprint(b)
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint(a))
    assert fingerprint(a) != fingerprint({**a, "to": ["+2"]})
    assert fingerprint(a) != fingerprint({**a, "extra": None})


def test_derived_key() -> None:
    protector = AddressProtector(b"k" * 32, [Fernet.generate_key().decode()])
    client = uuid.uuid4()
    key = derived_key(protector, client, "idem", "email", "a@example.com")
    assert re.fullmatch(r"[0-9a-f]{64}", key)  # valid SES tag value, URL-safe
    assert key == derived_key(protector, client, "idem", "email", "a@example.com")
    others = {
        derived_key(protector, uuid.uuid4(), "idem", "email", "a@example.com"),
        derived_key(protector, client, "idem2", "email", "a@example.com"),
        derived_key(protector, client, "idem", "sms", "a@example.com"),
        derived_key(protector, client, "idem", "email", "b@example.com"),
        derived_key(
            AddressProtector(b"j" * 32, [Fernet.generate_key().decode()]),
            client,
            "idem",
            "email",
            "a@example.com",
        ),
    }
    assert key not in others and len(others) == 5
    # Not the plain address hash: the derived key is domain-separated.
    assert key != protector.hash("email", "a@example.com")
