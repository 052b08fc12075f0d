"""Twilio error codes: the one table the send path and the feedback path both classify with.

A code means the same whether `messages.create` answered it or a status callback
(`failed`/`undelivered`) carried it: `sender.classify` reads the table for send answers,
`webhooks.classify` derives its `twilio:<code>` rows from it. (Before, the two sides kept
their own copies, which drifted: 30010 was account-level at send time and a transient,
retried failure in a callback.) Twilio warns that codes shift over time, which is why this is
data that settings can override (`GATEWAY_SEND_ERROR_OVERRIDES`,
`GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES`). Sources: ../shared/PROVIDERS.md section 4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retry.settings import RateSpec
from sender.providers.codes import (
    ACCOUNT,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    TRANSIENT,
    ErrorTable,
)
from sender.providers.spec import ProviderContext, SendSpec

CODES: dict[str, tuple[str, str]] = {
    "20003": (ACCOUNT, "authentication failed"),
    "20429": (TRANSIENT, "too many requests"),
    "21211": (PERMANENT_ADDRESS, "invalid 'To' number"),
    "21212": (ACCOUNT, "invalid 'From' number"),
    # Geo permissions: the account may not text the To number's country. Every message to
    # that region fails the same way until someone changes the account; others go out.
    "21408": (
        DESTINATION,
        "SMS to the 'To' region is not enabled for this account (Twilio geo permissions)",
    ),
    "21602": (PERMANENT_MESSAGE, "message body required"),
    "21606": (ACCOUNT, "'From' number not owned by the account"),
    # Trial accounts (or accounts without an approved compliance profile) may only text
    # verified numbers: about this recipient and the account's configuration.
    "21608": (
        DESTINATION,
        "'To' number not verified for this account (trial or compliance profile restriction)",
    ),
    "21610": (PERMANENT_ADDRESS, "recipient unsubscribed (STOP)"),
    "21611": (TRANSIENT, "'From' queue full"),
    # "Not currently reachable via SMS" with this To/From combination: sender-ID rules of the
    # destination country or network, a carrier without connectivity. About this recipient.
    "21612": (RECIPIENT, "'To' not reachable by SMS from this sender"),
    "21614": (PERMANENT_ADDRESS, "'To' is not a valid mobile number"),
    "21617": (PERMANENT_MESSAGE, "message body too long"),
    "21635": (PERMANENT_ADDRESS, "'To' is a landline"),
    "30001": (TRANSIENT, "queue overflow"),
    "30002": (ACCOUNT, "account suspended"),
    "30003": (TRANSIENT, "unreachable handset"),
    "30004": (PERMANENT_ADDRESS, "message blocked"),
    "30005": (PERMANENT_ADDRESS, "unknown destination handset"),
    "30006": (PERMANENT_ADDRESS, "landline or unreachable carrier"),
    "30007": (PERMANENT_MESSAGE, "message filtered by the carrier"),
    "30008": (TRANSIENT, "unknown error"),
    "30009": (TRANSIENT, "missing segment"),
    "30010": (ACCOUNT, "price exceeds max price"),
    "30032": (ACCOUNT, "toll-free number not verified"),
    "30034": (ACCOUNT, "A2P 10DLC: unregistered number"),
}

TABLE = ErrorTable(
    "twilio",
    CODES,
    # The recipient texted STOP: suppressed as an opt-out, lifted by START.
    opt_out=frozenset({"21610"}),
    # Carrier-side delivery errors and a sender's own queue: about one message, sender or
    # recipient, not about Twilio, so they never count against its circuit breaker.
    recipient_scoped=frozenset({"21611", "30003", "30008", "30009"}),
)


def _build(ctx: ProviderContext) -> Provider:
    from sender.providers.twilio import TwilioProvider  # the SDK is imported on use only

    s = ctx.settings
    assert s.twilio_account_sid and s.twilio_auth_tokens
    return TwilioProvider(
        account_sid=s.twilio_account_sid,
        auth_token=s.twilio_auth_tokens[0],
        public_url=ctx.public_url,
        sms_from=s.sms_from,
        messaging_service_sid=s.twilio_messaging_service_sid,
        api_base=s.twilio_api_base,
        connect_timeout=ctx.connect_timeout,
        read_timeout=ctx.read_timeout,
    )


SEND = SendSpec(
    name="twilio",
    channel="sms",
    build=_build,
    errors=TABLE,
    # Throughput is per sender (number or Messaging Service): a US long code sends 1 SMS/s.
    rate_limits={"twilio:*": RateSpec(1.0)},
    # Read by gateway/settings.py (validated there; see the README "Providers" section).
    settings=(
        "GATEWAY_TWILIO_ACCOUNT_SID",
        "GATEWAY_TWILIO_AUTH_TOKEN",
        "GATEWAY_TWILIO_SUBACCOUNT_TOKENS",
        "GATEWAY_TWILIO_MESSAGING_SERVICE_SID",
        "GATEWAY_TWILIO_API_BASE",
    ),
)

if TYPE_CHECKING:
    from sender.providers.base import Provider
