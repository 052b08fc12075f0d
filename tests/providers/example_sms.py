"""A tiny example provider, "examplesms": everything a new provider brings, in one file.

In the product it would be two modules and one line:

* ``sender/providers/examplesms.py``: the adapter and `SEND` (its error table, its default
  rate-limit bucket, the settings it reads);
* ``webhooks/examplesms.py``: the verifier, the parser, the classification keys and rows,
  the route and `FEEDBACK`;
* ``gateway/providers.py``: ``Registration(examplesms.SEND, examplesms_feedback.FEEDBACK),``.

The provider is made up (it is not a client of anyone's API): `send` "accepts" every number
except a few magic ones that answer error codes, and keeps what it accepted in `OUTBOX`.
Its webhook is a JSON body ``{"id", "message_id", "status", "code"?, "to"?}`` signed with
HMAC-SHA256 of the body under the secret GATEWAY_EXAMPLESMS_SECRET, hex in the header
``X-Example-Signature``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Mapping
from typing import Any

from retry.settings import RateSpec
from sender.classify import SendOutcome
from sender.providers.base import OutgoingMessage
from sender.providers.codes import (
    ACCOUNT,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    TRANSIENT,
    ErrorTable,
)
from sender.providers.spec import ProviderContext, SendSpec, SettingError
from webhooks.classify import error_rows
from webhooks.errors import MalformedPayload, VerificationFailed
from webhooks.events import FeedbackEvent, normalize_recipient
from webhooks.spec import FeedbackSpec, WebhookRequest

NAME = "examplesms"
SECRET_SETTING = "GATEWAY_EXAMPLESMS_SECRET"

# ---- send side (sender/providers/examplesms.py) ---------------------------------------------

ERRORS = ErrorTable(
    NAME,
    {
        "E100": (PERMANENT_ADDRESS, "no such number"),
        "E200": (TRANSIENT, "handset unreachable"),
        "E300": (PERMANENT_MESSAGE, "content refused"),
        "E900": (ACCOUNT, "account out of credit"),
    },
    recipient_scoped=frozenset({"E200"}),
)
# To -> the code the made-up API answers for it.
MAGIC = {"+15005550100": "E100", "+15005550900": "E900"}
OUTBOX: list[OutgoingMessage] = []


class ExampleSmsProvider:
    """Sends nothing anywhere: records the message and makes up its id."""

    name = NAME
    channel = "sms"

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def limiter_key(self, message: OutgoingMessage) -> str:
        """One bucket per sender."""
        return f"{NAME}:{message.sender or '*'}"

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """One made-up API call."""
        code = MAGIC.get(message.to)
        if code is not None:
            return SendOutcome(NAME, error_code=code, http_status=400, message="refused")
        OUTBOX.append(message)
        return SendOutcome(NAME, provider_message_id=f"ex-{message.delivery_id}")

    async def close(self) -> None:
        """Nothing to release."""


def _check(env: Mapping[str, str]) -> None:
    if not env.get(SECRET_SETTING):
        raise SettingError(SECRET_SETTING, f"is required when GATEWAY_SMS_PROVIDER={NAME}")


SEND = SendSpec(
    name=NAME,
    channel="sms",
    build=lambda ctx: ExampleSmsProvider(ctx.env[SECRET_SETTING]),
    errors=ERRORS,
    rate_limits={f"{NAME}:*": RateSpec(50.0)},
    settings=(SECRET_SETTING,),
    check=_check,
)

# ---- feedback side (webhooks/examplesms.py) ---------------------------------------------------


def sign(secret: str, body: bytes) -> str:
    """The signature the made-up provider sends."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class ExampleVerifier:
    """HMAC-SHA256 of the raw body (constant-time compare)."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret

    @property
    def configured(self) -> bool:
        """Without a secret everything is refused."""
        return bool(self._secret)

    def verify(self, request: WebhookRequest) -> None:
        """Raise `VerificationFailed` unless the body carries the right signature."""
        if not self._secret:
            raise VerificationFailed("no secret configured", reason="no_secret_configured")
        given = request.headers.get("x-example-signature")
        if not given:
            raise VerificationFailed("no signature", reason="missing_signature")
        if not hmac.compare_digest(given, sign(self._secret, request.body)):
            raise VerificationFailed("signature does not match", reason="bad_signature")


def parse(request: WebhookRequest) -> list[FeedbackEvent]:
    """The JSON body as one normalized event."""
    try:
        data = json.loads(request.body)
    except (ValueError, RecursionError):
        raise MalformedPayload("body is not JSON") from None
    if not isinstance(data, dict) or not all(
        isinstance(data.get(k), str) and data.get(k) for k in ("id", "message_id", "status")
    ):
        raise MalformedPayload("id, message_id and status are required strings")
    details: dict[str, Any] = {}
    if isinstance(data.get("code"), str) and data["code"]:
        details["error_code"] = data["code"][:16]
    return [
        FeedbackEvent(
            provider=NAME,
            provider_event_id=data["id"][:128],
            event_type=data["status"][:32],
            channel="sms",
            provider_message_id=data["message_id"][:128],
            recipient=normalize_recipient("sms", data.get("to"), request.default_region),
            details=details,
            raw=data,
        )
    ]


def table_keys(event: FeedbackEvent) -> list[str]:
    """``examplesms:<code>`` for failures, ``examplesms:status:<status>`` otherwise."""
    if event.event_type == "failed":
        code = event.details.get("error_code")
        return [*([f"{NAME}:{code}"] if code else []), f"{NAME}:default"]
    return [f"{NAME}:status:{event.event_type}", f"{NAME}:status:unknown"]


TABLE = {
    f"{NAME}:status:sent": "sent",
    f"{NAME}:status:delivered": "delivered",
    f"{NAME}:status:unknown": "ignored",
    f"{NAME}:default": "transient",
    # The send side's table, so both directions agree on every code.
    **error_rows(ERRORS, channel="sms"),
}


def _routes() -> list[Any]:
    from webhooks.api import webhook_route

    return [webhook_route(NAME, f"/webhooks/{NAME}", parse, summary="Example SMS callbacks")]


def _verifier(ctx: ProviderContext) -> ExampleVerifier:
    return ExampleVerifier(ctx.env.get(SECRET_SETTING))


FEEDBACK = FeedbackSpec(
    name=NAME,
    channel="sms",
    routes=_routes,
    table_keys=table_keys,
    table=TABLE,
    build_verifier=_verifier,
)


def new_event_id() -> str:
    """A fresh provider event id."""
    return uuid.uuid4().hex
