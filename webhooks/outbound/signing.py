"""Signing secrets and the Standard Webhooks signature header.

A secret is `whsec_` + base64 of 32 random bytes (the spec's format, accepted as it is by
every Standard Webhooks verifier). Signatures are made by the `standardwebhooks` package
(`v1,<base64 HMAC-SHA256 of "id.timestamp.body">`); after a rotation the previous secret
keeps signing beside the new one, and the header carries both signatures, space-separated,
so a receiver that still has the old secret verifies, and so does one that has the new.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from collections.abc import Sequence

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"  # noqa: S105  (the format's prefix, not a secret)
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh signing secret, `whsec_...`."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def signature_header(
    secrets_: Sequence[str], *, event_id: str, timestamp: dt.datetime, body: str
) -> str:
    """The `webhook-signature` value: one `v1,<signature>` per secret (newest first), space-
    separated."""
    return " ".join(
        Webhook(secret).sign(msg_id=event_id, timestamp=timestamp, data=body) for secret in secrets_
    )


def signed_headers(
    secrets_: Sequence[str], *, event_id: str, timestamp: dt.datetime, body: str
) -> dict[str, str]:
    """The three Standard Webhooks headers of one push (plus the JSON content type)."""
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signature_header(
            secrets_, event_id=event_id, timestamp=timestamp, body=body
        ),
    }
