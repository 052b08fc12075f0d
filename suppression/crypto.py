"""Addresses at rest: a keyed hash for look-ups and MultiFernet ciphertext for display.

The hash is HMAC-SHA256 over the normalized address with a server secret, so the same
person always maps to the same row while the table alone reveals nothing. The ciphertext
uses MultiFernet: the first key encrypts, every key decrypts, so keys can rotate.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

__all__ = ["AddressProtector", "InvalidToken"]


class AddressProtector:
    """Hashes and encrypts normalized addresses (and other small personal payloads)."""

    def __init__(self, hash_key: bytes, fernet_keys: Sequence[str]) -> None:
        if len(hash_key) < 32:
            raise ValueError("hash key must be at least 32 bytes")
        if not fernet_keys:
            raise ValueError("at least one Fernet key is required")
        self._hash_key = hash_key
        fernets = [Fernet(k) for k in fernet_keys]
        self._primary = fernets[0]
        self._fernet = MultiFernet(fernets)

    def hash(self, channel: str, normalized_address: str) -> str:
        """Keyed hash of a normalized address, scoped by channel (hex, 64 chars)."""
        msg = f"{channel}\x00{normalized_address}".encode()
        return hmac.new(self._hash_key, msg, hashlib.sha256).hexdigest()

    def encrypt(self, plaintext: str) -> str:
        """Encrypt with the newest key."""
        return self._primary.encrypt(plaintext.encode()).decode("ascii")

    def decrypt(self, token: str, ttl: int | None = None) -> str:
        """Decrypt with any configured key; raises `InvalidToken` when none fits."""
        return self._fernet.decrypt(token.encode("ascii"), ttl=ttl).decode()

    def rotate(self, token: str) -> str:
        """Re-encrypt a ciphertext with the newest key."""
        return self._fernet.rotate(token.encode("ascii")).decode("ascii")

    def is_current(self, token: str) -> bool:
        """True when `token` is already encrypted with the newest key (nothing to rotate)."""
        try:
            self._primary.decrypt(token.encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            return False
        return True

    def encrypt_bytes(self, data: bytes, at: int | None = None) -> str:
        """Encrypt arbitrary bytes with the newest key; the result is URL-safe base64.

        `at` (Unix seconds) sets the timestamp Fernet embeds in the token.
        """
        token = self._fernet.encrypt(data) if at is None else self._fernet.encrypt_at_time(data, at)
        return token.decode("ascii")

    def decrypt_bytes(self, token: str) -> bytes:
        """Decrypt a token made by `encrypt_bytes` with any configured key.

        Raises `InvalidToken` for anything that is not a valid token under one of the keys.
        """
        try:
            raw = token.encode("ascii")
        except UnicodeEncodeError:
            raise InvalidToken from None
        return self._fernet.decrypt(raw)
