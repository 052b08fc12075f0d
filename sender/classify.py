"""Classification of send-time outcomes: table-driven, pure, overridable by settings.

A provider adapter reports what it observed on one call as a `SendOutcome` (an accepted
message id, or an error code / HTTP status / transport failure). `classify` maps it to one of
eight classes that decide what the dispatcher does:

* `accepted` — the provider took the message: delivery `sent`.
* `transient` — try again later (bounded backoff; Retry-After is a floor).
* `permanent_message` — this message can never go out: delivery `failed`.
* `permanent_address` — the address is bad: delivery `failed` and the address suppressed
  (`invalid_address`, or `sms_stop` for Twilio 21610).
* `recipient` — the provider refused this one recipient for now (Twilio 21612: the number is not
  reachable by SMS from this sender): no suppression, retried within the attempt budget and
  the deadline, then `failed` with the reason.
* `destination` — our account may not send to this destination (Twilio 21408: SMS to the
  number's region is not enabled for the account): `failed` at once with a reason that says
  so, no suppression, and the account configuration is flagged (log line, metric).
* `account` — a problem of the whole account (paused/suspended, bad credentials, unverified
  sender): no suppression, the delivery is deferred and the provider's circuit is told.
* `unknown_outcome` — the request went out and no answer came back (read timeout, dropped
  connection): the provider may have sent it, so the delivery waits for a callback.

Only outcomes about the provider as a whole count against its circuit breaker
(`Classification.provider_wide`): `account`, and `transient`/`unknown_outcome` unless the key
is about one message or recipient (`RECIPIENT_SCOPED_KEYS`, e.g. Twilio 30003). A refusal
about one recipient, one destination region or one message is that delivery's outcome and
shows that the provider is answering.

The tables are data: keys are `<provider>:<code>` for provider error codes,
`<provider>:http_<status>` and `<provider>:http_<N>xx` for HTTP statuses,
`<provider>:connection_not_sent` / `<provider>:connection_after_send` for transport failures
and `<provider>:default` for anything else. `GATEWAY_SEND_ERROR_OVERRIDES` (a JSON object
key -> class) replaces entries; the first key that matches in that order wins.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ACCEPTED = "accepted"
TRANSIENT = "transient"
PERMANENT_MESSAGE = "permanent_message"
PERMANENT_ADDRESS = "permanent_address"
RECIPIENT = "recipient"
DESTINATION = "destination"
ACCOUNT = "account"
UNKNOWN_OUTCOME = "unknown_outcome"

CLASSES: tuple[str, ...] = (
    ACCEPTED,
    TRANSIENT,
    PERMANENT_MESSAGE,
    PERMANENT_ADDRESS,
    RECIPIENT,
    DESTINATION,
    ACCOUNT,
    UNKNOWN_OUTCOME,
)

# Where a transport failure happened: before the request could have reached the provider
# (connection refused, connect timeout) or after it went out (read timeout, dropped reply).
Transport = Literal["not_sent", "after_send"]


@dataclass(frozen=True)
class SendOutcome:
    """What an adapter observed on one provider call, in provider-neutral terms."""

    provider: str
    provider_message_id: str | None = None
    error_code: str | None = None
    http_status: int | None = None
    retry_after: float | None = None
    transport: Transport | None = None
    message: str | None = None

    @property
    def accepted(self) -> bool:
        """True when the provider returned a message id and no error."""
        return (
            self.provider_message_id is not None
            and self.error_code is None
            and self.transport is None
            and (self.http_status is None or self.http_status < 400)
        )


@dataclass(frozen=True)
class Classification:
    """The class of an outcome, the table key that decided it, and what follows from it."""

    kind: str
    key: str
    description: str
    suppression_reason: str | None = None
    retry_after: float | None = None
    # Does this outcome say something about the provider (or our whole account) rather than
    # about one recipient or message? Only those count against the circuit breaker.
    provider_wide: bool = False

    @property
    def reason(self) -> str:
        """A short, address-free reason for the delivery (`<key> <description>`)."""
        return f"{self.key} {self.description}".strip()


# SESv2 SendEmail exceptions (botocore sesv2 model; PROVIDERS.md section 3). None of them
# carries the `retryable` trait; our own retry layer decides.
SES_TABLE: dict[str, tuple[str, str]] = {
    "TooManyRequestsException": (TRANSIENT, "maximum sending rate exceeded"),
    "ThrottlingException": (TRANSIENT, "throttled"),
    # Botocore retries it as throttling, but SES means a resource quota: configuration.
    "LimitExceededException": (ACCOUNT, "limit exceeded"),
    "AccountSuspendedException": (ACCOUNT, "account suspended"),
    "SendingPausedException": (ACCOUNT, "sending paused"),
    "MailFromDomainNotVerifiedException": (ACCOUNT, "MAIL FROM domain not verified"),
    "NotFoundException": (ACCOUNT, "resource not found (configuration set?)"),
    "AccessDeniedException": (ACCOUNT, "access denied"),
    "UnrecognizedClientException": (ACCOUNT, "unrecognized credentials"),
    "InvalidSignatureException": (ACCOUNT, "invalid request signature"),
    "NoCredentials": (ACCOUNT, "no AWS credentials"),
    "MessageRejected": (PERMANENT_MESSAGE, "message rejected"),
    "BadRequestException": (PERMANENT_MESSAGE, "bad request"),
    "ParamValidation": (PERMANENT_MESSAGE, "request failed client-side validation"),
    "InternalFailure": (TRANSIENT, "internal failure"),
    "ServiceUnavailable": (TRANSIENT, "service unavailable"),
}

# Twilio error codes (PROVIDERS.md section 4). Twilio warns that codes shift over time,
# which is why this is data that settings can override.
TWILIO_TABLE: dict[str, tuple[str, str]] = {
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

# Address-level codes that mean "the recipient opted out" rather than "the address is bad".
OPT_OUT_KEYS: frozenset[str] = frozenset({"twilio:21610"})

# Transient codes about one message, sender or recipient (Twilio's carrier-side delivery
# errors, a sender's own queue), not about the provider: they retry, but never count
# against the provider's circuit breaker.
RECIPIENT_SCOPED_KEYS: frozenset[str] = frozenset(
    {"twilio:21611", "twilio:30003", "twilio:30008", "twilio:30009"}
)

# Rules that apply to every provider (looked up as `<provider>:<suffix>`, then `*:<suffix>`).
GENERIC_TABLE: dict[str, tuple[str, str]] = {
    "http_429": (TRANSIENT, "throttled (HTTP 429)"),
    "http_5xx": (TRANSIENT, "provider error (HTTP 5xx)"),
    "connection_not_sent": (TRANSIENT, "connection failed before the request was sent"),
    "connection_after_send": (UNKNOWN_OUTCOME, "no answer after the request was sent"),
    # DESIGN: unknown codes are treated as transient (and bounded by the retry budget).
    "default": (TRANSIENT, "unclassified error"),
}


def default_table() -> dict[str, tuple[str, str]]:
    """The built-in table as `key -> (class, description)`."""
    table: dict[str, tuple[str, str]] = {}
    table.update({f"ses:{code}": entry for code, entry in SES_TABLE.items()})
    table.update({f"twilio:{code}": entry for code, entry in TWILIO_TABLE.items()})
    table.update({f"*:{suffix}": entry for suffix, entry in GENERIC_TABLE.items()})
    return table


_DEFAULT = default_table()


def parse_overrides(raw: str | None) -> dict[str, str]:
    """Parse `GATEWAY_SEND_ERROR_OVERRIDES`: a JSON object `key -> class`.

    Raises `ValueError` with a readable message on bad JSON, a bad key or an unknown class.
    """
    if raw is None or not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object of key -> class")
    result: dict[str, str] = {}
    for key, value in data.items():
        provider, sep, code = key.partition(":")
        if not sep or not provider or not code:
            raise ValueError(f"key {key!r} must look like <provider>:<code>")
        if value not in CLASSES or value == ACCEPTED:
            choices = ", ".join(c for c in CLASSES if c != ACCEPTED)
            raise ValueError(f"class of {key!r} must be one of {choices}")
        result[key] = value
    return result


def _lookup_keys(outcome: SendOutcome) -> list[str]:
    p = outcome.provider
    keys: list[str] = []
    if outcome.transport is not None:
        suffix = (
            "connection_after_send" if outcome.transport == "after_send" else "connection_not_sent"
        )
        return [f"{p}:{suffix}", f"*:{suffix}"]
    if outcome.error_code:
        keys.append(f"{p}:{outcome.error_code}")
    if outcome.http_status is not None:
        status = outcome.http_status
        keys += [f"{p}:http_{status}", f"*:http_{status}"]
        keys += [f"{p}:http_{status // 100}xx", f"*:http_{status // 100}xx"]
    keys += [f"{p}:default", "*:default"]
    return keys


def classify(outcome: SendOutcome, overrides: Mapping[str, str] | None = None) -> Classification:
    """Map one provider call's outcome to its class (overrides win over the built-in table)."""
    if outcome.accepted:
        return Classification(ACCEPTED, f"{outcome.provider}:accepted", "accepted")
    overrides = overrides or {}
    for key in _lookup_keys(outcome):
        kind: str | None = overrides.get(key)
        description = _DEFAULT[key][1] if key in _DEFAULT else "overridden by settings"
        if kind is None and key in _DEFAULT:
            kind = _DEFAULT[key][0]
        if kind is None:
            continue
        shown = key
        if key.startswith("*:"):
            shown = f"{outcome.provider}:{key[2:]}"
        suppression = None
        if kind == PERMANENT_ADDRESS:
            suppression = "sms_stop" if key in OPT_OUT_KEYS else "invalid_address"
        retry_after = outcome.retry_after if kind in (TRANSIENT, ACCOUNT, RECIPIENT) else None
        provider_wide = kind == ACCOUNT or (
            kind in (TRANSIENT, UNKNOWN_OUTCOME) and key not in RECIPIENT_SCOPED_KEYS
        )
        return Classification(kind, shown, description, suppression, retry_after, provider_wide)
    raise AssertionError("the generic default always matches")  # pragma: no cover
