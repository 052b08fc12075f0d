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
* Twilio inbound: ``twilio:inbound`` (the keyword handling is fixed: STOP/START/HELP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    """

    name: str
    state: str | None = None
    suppression: str | None = None
    retry: bool = False
    soft_bounce: bool = False
    flag_provider: bool = False
    opens_circuit: bool = False


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
        Outcome("account", state=FAILED, flag_provider=True, opens_circuit=True),
        Outcome("destination", state=FAILED, flag_provider=True),
        # Topic (un)subscriptions and inbound keywords act on the address only.
        Outcome("subscription"),
        Outcome("inbound"),
        Outcome("ignored"),
    )
}
# What an override may name (the two special ones only make sense for their own events).
OVERRIDABLE_OUTCOMES = frozenset(OUTCOMES) - {"subscription", "inbound"}

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
    # Reject (a virus) and Rendering Failure: this message can never go; the address is fine.
    "ses:reject": "failed",
    "ses:rendering_failure": "failed",
    # Every Permanent subtype is a hard bounce, also unknown ones. Suppressed (global list)
    # and OnAccountSuppressionList mean SES did not even try: still a bad address for us.
    "ses:bounce:Permanent": "hard_bounce",
    "ses:bounce:Permanent:General": "hard_bounce",
    "ses:bounce:Permanent:NoEmail": "hard_bounce",
    "ses:bounce:Permanent:Suppressed": "hard_bounce",
    "ses:bounce:Permanent:OnAccountSuppressionList": "hard_bounce",
    # A "transient" bounce whose SMTP status is 5.x.x is a permanent failure in disguise.
    "ses:bounce:Transient:status_5xx": "hard_bounce",
    "ses:bounce:Transient": "soft_bounce",
    "ses:bounce:Undetermined": "soft_bounce",
    "ses:bounce:default": "soft_bounce",
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
    # Twilio error codes of failed/undelivered messages.
    "twilio:21610": "opt_out",
    "twilio:21211": "invalid_address",
    "twilio:21614": "invalid_address",
    "twilio:30004": "invalid_address",
    "twilio:30005": "invalid_address",
    "twilio:30006": "invalid_address",
    "twilio:30001": "transient",
    "twilio:30003": "transient",
    "twilio:30008": "transient",
    "twilio:30009": "transient",
    "twilio:30007": "failed",
    "twilio:30002": "account",
    "twilio:30032": "account",
    "twilio:30034": "account",
    # About one destination or recipient, never the whole account: the region is not
    # enabled for the account (flagged for the operator) / the number is not reachable
    # from this sender.
    "twilio:21408": "destination",
    "twilio:21612": "failed",
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


def table_keys(event: FeedbackEvent) -> list[str]:
    """The table keys tried for `event`, most specific first."""
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


def classify(event: FeedbackEvent, overrides: Mapping[str, str] | None = None) -> Classification:
    """The outcome of `event` (overrides first, then the default table; else `ignored`)."""
    overrides = overrides or {}
    for key in table_keys(event):
        name = overrides.get(key) or DEFAULT_TABLE.get(key)
        if name is not None:
            return Classification(OUTCOMES[name], key)
    return Classification(OUTCOMES["ignored"], "none")
