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

A provider's codes are its `ErrorTable` (`sender/providers/twilio_spec.py`, `ses_spec.py`,
or a registered provider's, `register_errors`); the feedback side (`webhooks.classify`)
classifies callbacks from the same table, so a code means the same in both directions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sender.providers import ses_spec, twilio_spec
from sender.providers.codes import (
    ACCEPTED,
    ACCOUNT,
    CLASSES,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    TRANSIENT,
    UNKNOWN_OUTCOME,
    ErrorTable,
)

__all__ = [
    "ACCEPTED",
    "ACCOUNT",
    "CLASSES",
    "DESTINATION",
    "PERMANENT_ADDRESS",
    "PERMANENT_MESSAGE",
    "RECIPIENT",
    "TRANSIENT",
    "UNKNOWN_OUTCOME",
    "Classification",
    "ErrorTable",
    "SendOutcome",
    "classify",
    "default_table",
    "parse_overrides",
    "register_errors",
]

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


# Each provider's codes live with its adapter (one table for both directions); the tables
# of registered providers (`register_errors`) are looked up as `<provider>:<code>`.
SES_TABLE = ses_spec.CODES
TWILIO_TABLE = twilio_spec.CODES
_TABLES: dict[str, ErrorTable] = {}

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
    """The built-in table as `key -> (class, description)` (every registered provider)."""
    table: dict[str, tuple[str, str]] = {}
    for errors in _TABLES.values():
        table.update({f"{errors.provider}:{code}": e for code, e in errors.codes.items()})
    table.update({f"*:{suffix}": entry for suffix, entry in GENERIC_TABLE.items()})
    return table


_DEFAULT: dict[str, tuple[str, str]] = {}
# Address-level keys that mean "the recipient opted out" rather than "the address is bad".
OPT_OUT_KEYS: set[str] = set()
# Transient keys about one message, sender or recipient (Twilio's carrier-side delivery
# errors, a sender's own queue), not about the provider: they retry, but never count
# against the provider's circuit breaker.
RECIPIENT_SCOPED_KEYS: set[str] = set()


def register_errors(errors: ErrorTable) -> None:
    """Make a provider's error table part of the send-side classification (idempotent; a
    table registered again under the same provider name replaces the earlier one)."""
    _TABLES[errors.provider] = errors
    _DEFAULT.clear()
    _DEFAULT.update(default_table())
    OPT_OUT_KEYS.clear()
    RECIPIENT_SCOPED_KEYS.clear()
    for table in _TABLES.values():
        OPT_OUT_KEYS.update(f"{table.provider}:{code}" for code in table.opt_out)
        RECIPIENT_SCOPED_KEYS.update(f"{table.provider}:{code}" for code in table.recipient_scoped)


def error_table(provider: str) -> ErrorTable | None:
    """The registered error table of `provider`, if any."""
    return _TABLES.get(provider)


register_errors(ses_spec.TABLE)
register_errors(twilio_spec.TABLE)


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
