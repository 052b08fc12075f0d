"""Classification of provider feedback: table-driven, pure, overridable by settings.

Each normalized event is looked up in `DEFAULT_TABLE` under a list of keys, most specific
first; the first key present (in the overrides from
``GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES``, else in the defaults) names an *outcome*.
An outcome says which provider state the attempt reaches (see `webhooks.state`), which
suppression the address gets, and whether the delivery goes to the bounded retry queue.

Keys tried, in order:

* SES bounce: ``ses:bounce:<Type>:status_5xx`` (only when the SMTP status is 5.x.x),
  ``ses:bounce:<Type>:<SubType>``, ``ses:bounce:<Type>``, ``ses:bounce:default``;
* SES complaint: ``ses:complaint:<feedback type>``, ``ses:complaint``;
* other SES events: ``ses:<event type>`` (send, delivery, delivery_delay, reject,
  rendering_failure, open, click, subscription), else ``ses:unknown``;
* Twilio status: ``twilio:status:<MessageStatus>``; for ``failed``/``undelivered`` the
  error code then decides: ``twilio:<ErrorCode>``, ``twilio:default``;
* Twilio inbound: ``twilio:inbound`` (the keyword handling is fixed: STOP/START/HELP);
* a registered provider (`register`): the keys its own function returns.

Provider error codes are not a second table: the ``twilio:<code>`` rows and the SES bounce,
Reject and Rendering Failure rows are derived from the provider's one table
(`sender.providers.twilio_spec`, `sender.providers.ses_spec`), whose classes the send path
uses too (`outcome_for_class`). A class means the same in both directions:

* ``permanent_address`` suppresses (``invalid_address``/``hard_bounce``, ``opt_out``);
* ``permanent_message`` fails the message (``failed``); ``destination`` fails it and flags
  the account's configuration;
* ``transient`` retries within the budget (``transient``/``soft_bounce``); ``recipient``
  (Twilio 21612) retries within the budget and then fails, never dead-letters;
* ``account`` (paused or suspended account, price cap, unregistered sender: Twilio 30002,
  30010, 30032, ...) neither suppresses the recipient nor fails the message (DESIGN
  "Classify, don't guess"): the provider is flagged (warning, counter), its circuit is told,
  and the delivery waits ``queued`` for the account cool-down (`retry.policy.Failure.ACCOUNT`),
  as after an account-level answer at send time: not held to the attempt budget, bounded
  by its deadline and the maximum deferral age.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from retry.policy import Failure
from sender.providers import ses_spec, twilio_spec
from sender.providers.codes import (
    ACCOUNT,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    ErrorTable,
)
from sender.providers.codes import (
    TRANSIENT as TRANSIENT_CLASS,
)
from sender.status import BOUNCED, COMPLAINED, DELAYED, DELIVERED, FAILED, READ, SENT
from webhooks.events import FeedbackEvent
from webhooks.state import TRANSIENT

# ---- outcomes -------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a class of events does.

    `state`: the provider state the attempt reaches (None: the status never moves).
    `suppression`: the reason the recipient's address is suppressed for the whole channel.
    `retry`: the delivery goes to the bounded retry queue (a transient failure).
    `soft_bounce`: counts toward the soft-bounce threshold of the address.
    `flag_provider`: a problem of our provider account, not the recipient's (alert, metric).
    `opens_circuit`: a problem of the whole account (paused, suspended): the provider's
    circuit breaker is told. A destination the account is not set up for (a region not
    enabled) is flagged but is no reason to stop every other send.
    `failure`: how a `transient` state is retried (`retry.policy.decide`): back off within
    the budget, wait out the account cool-down, or retry and then fail (one recipient).
    """

    name: str
    state: str | None = None
    suppression: str | None = None
    retry: bool = False
    soft_bounce: bool = False
    flag_provider: bool = False
    opens_circuit: bool = False
    failure: Failure = Failure.TRANSIENT


OUTCOMES: dict[str, Outcome] = {
    o.name: o
    for o in (
        Outcome("sent", state=SENT),
        Outcome("delayed", state=DELAYED),
        Outcome("delivered", state=DELIVERED),
        Outcome("read", state=READ),
        Outcome("engagement"),
        Outcome("hard_bounce", state=BOUNCED, suppression="hard_bounce"),
        Outcome("soft_bounce", state=TRANSIENT, retry=True, soft_bounce=True),
        Outcome("complaint", state=COMPLAINED, suppression="complaint"),
        Outcome("not_spam"),
        Outcome("failed", state=FAILED),
        Outcome("opt_out", state=FAILED, suppression="sms_stop"),
        Outcome("invalid_address", state=FAILED, suppression="invalid_address"),
        Outcome("transient", state=TRANSIENT, retry=True),
        Outcome(
            "account",
            state=TRANSIENT,
            retry=True,
            flag_provider=True,
            opens_circuit=True,
            failure=Failure.ACCOUNT,
        ),
        Outcome("recipient", state=TRANSIENT, retry=True, failure=Failure.RECIPIENT),
        Outcome("destination", state=FAILED, flag_provider=True),
        # Topic (un)subscriptions and inbound keywords act on the address only.
        Outcome("subscription"),
        Outcome("inbound"),
        Outcome("ignored"),
    )
}
# What an override may name (the two special ones only make sense for their own events).
OVERRIDABLE_OUTCOMES = frozenset(OUTCOMES) - {"subscription", "inbound"}

# ---- one table per provider, both directions ---------------------------------------


def outcome_for_class(kind: str, *, channel: str, opt_out: bool = False) -> str:
    """The feedback outcome of a provider error class (`sender.providers.codes`)."""
    if kind == PERMANENT_ADDRESS:
        if opt_out:
            return "opt_out"
        return "hard_bounce" if channel == "email" else "invalid_address"
    if kind == TRANSIENT_CLASS:
        return "soft_bounce" if channel == "email" else "transient"
    return {
        PERMANENT_MESSAGE: "failed",
        RECIPIENT: "recipient",
        DESTINATION: "destination",
        ACCOUNT: "account",
    }[kind]


def error_rows(errors: ErrorTable, *, channel: str) -> dict[str, str]:
    """`<provider>:<code> -> outcome` for every code of a provider's error table."""
    return {
        f"{errors.provider}:{code}": outcome_for_class(
            kind, channel=channel, opt_out=code in errors.opt_out
        )
        for code, (kind, _) in errors.codes.items()
    }


# ---- the default table ----------------------------------------------------------------

_SMS_STATUS_SENT = ("queued", "accepted", "scheduled", "sending", "sent", "partially_delivered")

DEFAULT_TABLE: dict[str, str] = {
    # SES: Send and Delivery events, delays (never a bounce), engagement.
    "ses:send": "sent",
    "ses:delivery": "delivered",
    "ses:delivery_delay": "delayed",
    "ses:open": "engagement",
    "ses:click": "engagement",
    "ses:subscription": "subscription",
    "ses:unknown": "ignored",
    # Reject, Rendering Failure and every bounce type/subtype: from SES's one table.
    **{
        f"ses:{key}": outcome_for_class(kind, channel="email")
        for key, (kind, _) in ses_spec.FEEDBACK.items()
    },
    # A complaint suppresses; feedback type not-spam says the opposite and is only recorded.
    "ses:complaint": "complaint",
    "ses:complaint:not-spam": "not_spam",
    # Twilio statuses: everything up to "sent" is rank 1 (DESIGN.md).
    **{f"twilio:status:{s}": "sent" for s in _SMS_STATUS_SENT},
    "twilio:status:delivered": "delivered",
    "twilio:status:read": "read",
    "twilio:status:canceled": "failed",
    "twilio:status:receiving": "ignored",
    "twilio:status:received": "ignored",
    "twilio:status:unknown": "ignored",
    # Twilio error codes of failed/undelivered messages: Twilio's one table.
    **error_rows(twilio_spec.TABLE, channel="sms"),
    # Unknown codes, and failures without a code: transient, bounded by the retry budget.
    "twilio:default": "transient",
    "twilio:inbound": "inbound",
}

_FAILURE_STATUSES = ("failed", "undelivered")


@dataclass(frozen=True)
class Classification:
    """The outcome of one event and the table key that decided it (kept for the record)."""

    outcome: Outcome
    rule: str


TableKeys = Callable[[FeedbackEvent], list[str]]
# Provider -> its table-key function (the built-in two are below; others `register`).
_KEYS: dict[str, TableKeys] = {}


def register(provider: str, keys: TableKeys, rows: Mapping[str, str]) -> None:
    """Classify `provider`'s events with `keys` and add its default `rows` (each key must
    start with ``<provider>:`` and name a known outcome). Registering again replaces."""
    for key, name in rows.items():
        if not key.startswith(f"{provider}:") or name not in OUTCOMES:
            raise ValueError(f"bad classification row {key!r} -> {name!r} for {provider}")
    _KEYS[provider] = keys
    DEFAULT_TABLE.update(rows)


def providers() -> frozenset[str]:
    """The providers whose events are classified (override keys must name one of them)."""
    return frozenset(_KEYS)


def table_keys(event: FeedbackEvent) -> list[str]:
    """The table keys tried for `event`, most specific first."""
    if event.provider in ("ses", "twilio"):
        return _builtin_keys(event)
    keys = _KEYS.get(event.provider)
    return keys(event) if keys is not None else []


def _builtin_keys(event: FeedbackEvent) -> list[str]:
    d = event.details
    if event.provider == "ses":
        if event.event_type == "bounce":
            kind = str(d.get("bounce_type") or "default")
            sub = d.get("bounce_subtype")
            keys = []
            if str(d.get("status") or "").startswith("5."):
                keys.append(f"ses:bounce:{kind}:status_5xx")
            if sub:
                keys.append(f"ses:bounce:{kind}:{sub}")
            return [*keys, f"ses:bounce:{kind}", "ses:bounce:default"]
        if event.event_type == "complaint":
            feedback = d.get("feedback_type")
            return [*([f"ses:complaint:{feedback}"] if feedback else []), "ses:complaint"]
        return [f"ses:{event.event_type}", "ses:unknown"]
    if event.provider == "twilio":
        if event.event_type == "inbound":
            return ["twilio:inbound"]
        status = event.event_type
        if status in _FAILURE_STATUSES:
            code = d.get("error_code")
            return [*([f"twilio:{code}"] if code else []), "twilio:default"]
        return [f"twilio:status:{status}", "twilio:status:unknown"]
    return []


_KEYS["ses"] = _builtin_keys
_KEYS["twilio"] = _builtin_keys


def classify(event: FeedbackEvent, overrides: Mapping[str, str] | None = None) -> Classification:
    """The outcome of `event` (overrides first, then the default table; else `ignored`)."""
    overrides = overrides or {}
    for key in table_keys(event):
        name = overrides.get(key) or DEFAULT_TABLE.get(key)
        if name is not None:
            return Classification(OUTCOMES[name], key)
    return Classification(OUTCOMES["ignored"], "none")
