"""The console's sign-in session: a signed cookie that names an API key, and CSRF tokens.

Signing in checks an API key once (scope `read` or higher); the browser then holds a cookie
`<payload>.<mac>` where the payload names the key's id (never its secret), when the session
was issued and when it ends (8 hours later), and a random nonce. The MAC is HMAC-SHA256 under
a key derived from the server's hash key (`GATEWAY_HASH_KEY`, which the embedded default's
development secrets file provides), so no further secret has to be configured; the derivation
label keeps the two uses apart. Every request looks the key up by id again (one primary-key
statement, `gateway.keys.lookup_principal_by_id`): a revoked key's sessions end at their next
request, and a key whose scopes changed gets its new scopes.

CSRF: every form that changes something carries `HMAC(key, "csrf|" + nonce)`, which only a page
of this session can know; the cookie is also `SameSite=Strict`. The sign-in form, before any
session exists, uses a double-submit token (a random value in a short-lived cookie and in the
form).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass

COOKIE = "gw_console"
"""The session cookie's name."""
LOGIN_COOKIE = "gw_console_login"
"""The sign-in form's double-submit CSRF cookie."""
SESSION_SECONDS = 8 * 3600
"""A session ends 8 hours after sign-in, whatever happens in between."""
LOGIN_FORM_SECONDS = 3600
_LABEL = b"gateway console session v1"
_MAX_COOKIE = 1024


def signing_key(hash_key: bytes) -> bytes:
    """The cookie signing key, derived from the server's hash key (a label keeps it apart)."""
    return hmac.new(hash_key, _LABEL, hashlib.sha256).digest()


@dataclass(frozen=True)
class Session:
    """What a valid cookie says: whose key, issued when, valid until when, and its nonce."""

    key_id: uuid.UUID
    issued_at: int
    expires_at: int
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_session(key_id: uuid.UUID, *, now: float | None = None) -> Session:
    """A fresh session for a key that has just signed in."""
    issued = int(now if now is not None else time.time())
    return Session(key_id, issued, issued + SESSION_SECONDS, secrets.token_urlsafe(16))


def _mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, payload.encode("ascii"), hashlib.sha256).digest())


def encode(key: bytes, session: Session) -> str:
    """The cookie value of a session."""
    body = {
        "k": session.key_id.hex,
        "i": session.issued_at,
        "e": session.expires_at,
        "n": session.nonce,
    }
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{payload}.{_mac(key, payload)}"


def decode(key: bytes, value: str | None, *, now: float | None = None) -> Session | None:
    """The session a cookie value holds, or None when it is missing, forged, malformed or
    expired."""
    if not value or len(value) > _MAX_COOKIE or value.count(".") != 1:
        return None
    payload, mac = value.split(".")
    if not hmac.compare_digest(mac, _mac(key, payload)):
        return None
    try:
        body = json.loads(_unb64(payload))
        session = Session(uuid.UUID(hex=body["k"]), int(body["i"]), int(body["e"]), str(body["n"]))
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    current = now if now is not None else time.time()
    if current >= session.expires_at:
        return None
    return session


def csrf_token(key: bytes, session: Session) -> str:
    """The CSRF token of a session (what every changing form must carry back)."""
    return _mac(key, "csrf|" + session.nonce)


def csrf_ok(key: bytes, session: Session, token: str | None) -> bool:
    """True when `token` is this session's CSRF token."""
    return bool(token) and hmac.compare_digest(str(token), csrf_token(key, session))


def login_token() -> str:
    """A random double-submit token for the sign-in form."""
    return secrets.token_urlsafe(24)
