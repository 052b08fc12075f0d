"""Opaque unsubscribe tokens: round trip, opacity, key rotation, tampering."""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import uuid

import pytest
from cryptography.fernet import Fernet

from suppression.crypto import AddressProtector
from suppression.tokens import InvalidUnsubscribeToken, issue_token, read_token, unsubscribe_url

HASH_KEY = secrets.token_bytes(32)
OLD, NEW = Fernet.generate_key().decode(), Fernet.generate_key().decode()


def test_round_trip_and_nothing_readable_in_the_token() -> None:
    protector = AddressProtector(HASH_KEY, [NEW])
    delivery = uuid.uuid4()
    issued = dt.datetime(2026, 3, 1, 12, 0, 5, tzinfo=dt.UTC)
    token = issue_token(
        protector,
        channel="email",
        address="Jane.Doe@example.com",
        topic="newsletter",
        delivery_id=delivery,
        now=issued,
    )
    back = read_token(protector, token)
    assert (back.channel, back.address, back.topic) == (
        "email",
        "Jane.Doe@example.com",
        "newsletter",
    )
    assert back.delivery_id == delivery and back.issued_at == issued
    # URL-safe, and neither the token nor its base64 decoding shows the address or topic
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")
    raw = base64.urlsafe_b64decode(token)
    for secret in (b"Jane", b"jane", b"example", b"newsletter", delivery.hex.encode()):
        assert secret not in raw and secret.decode() not in token
    # Fernet's own timestamp is the issue time
    assert int.from_bytes(raw[1:9], "big") == int(issued.timestamp())
    assert (
        unsubscribe_url("https://gw.example/", token) == f"https://gw.example/unsubscribe/{token}"
    )


def test_tokens_from_an_older_key_still_read_after_rotation() -> None:
    old = AddressProtector(HASH_KEY, [OLD])
    token = issue_token(
        old, channel="email", address="a@example.com", topic="marketing", delivery_id=None
    )
    rotated = AddressProtector(HASH_KEY, [NEW, OLD])
    back = read_token(rotated, token)
    assert back.address == "a@example.com" and back.delivery_id is None
    # once the old key is gone, the old token is invalid
    with pytest.raises(InvalidUnsubscribeToken):
        read_token(AddressProtector(HASH_KEY, [NEW]), token)


def test_garbage_tampered_and_foreign_tokens_are_invalid() -> None:
    protector = AddressProtector(HASH_KEY, [NEW])
    token = issue_token(
        protector, channel="sms", address="+12025550143", topic="marketing", delivery_id=None
    )
    tampered = token[:20] + ("A" if token[20] != "A" else "B") + token[21:]
    # a valid Fernet token whose content is not ours
    foreign = Fernet(NEW.encode()).encrypt(json.dumps({"v": 1, "c": "fax"}).encode()).decode()
    not_json = Fernet(NEW.encode()).encrypt(b"\xff\x00").decode()
    for bad in ("", "x", "ünïcode", tampered, foreign, not_json, token[:-8]):
        with pytest.raises(InvalidUnsubscribeToken):
            read_token(protector, bad)
    with pytest.raises(ValueError):
        issue_token(protector, channel="fax", address="x", topic="t", delivery_id=None)
