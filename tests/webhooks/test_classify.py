"""Classification: every row of the table, the lookup order, and settings overrides."""

from __future__ import annotations

import pytest

from gateway.settings import SettingsError, load_settings
from tests.webhooks.feedback import ses_event, ses_payload, status_params
from webhooks.classify import DEFAULT_TABLE, OUTCOMES, classify, table_keys
from webhooks.events import FeedbackEvent
from webhooks.ses import parse_notification
from webhooks.settings import parse_classification_overrides
from webhooks.twilio import parse_inbound, parse_status


def ses(kind: str, **kwargs: object) -> FeedbackEvent:
    (event,) = parse_notification(ses_event(kind, message_id="m", **kwargs), event_id="e")  # type: ignore[arg-type]
    return event


def tw(status: str, code: str | None = None) -> FeedbackEvent:
    return parse_status(
        status_params("SM1", status, error_code=code), query={}, idempotency_token=None
    )


@pytest.mark.parametrize(
    "subtype",
    ["General", "NoEmail", "Suppressed", "OnAccountSuppressionList", "UnsubscribedRecipient"],
)
@pytest.mark.parametrize("shape", ["event", "notification"])
def test_every_permanent_bounce_is_hard(subtype: str, shape: str) -> None:
    outcome = classify(ses("Bounce", bounce_subtype=subtype, shape=shape)).outcome
    assert (outcome.name, outcome.state, outcome.suppression) == (
        "hard_bounce",
        "bounced",
        "hard_bounce",
    )
    assert not outcome.retry


def test_genuine_suppressed_bounce_is_hard() -> None:
    (event,) = parse_notification(
        ses_payload("aerendir-real-notification-bounce-permanent-suppressed-simulator.json"),
        event_id="x",
    )
    assert classify(event).rule == "ses:bounce:Permanent:Suppressed"
    assert classify(event).outcome.suppression == "hard_bounce"


@pytest.mark.parametrize(
    ("bounce_type", "subtype", "status", "expected"),
    [
        ("Transient", "MailboxFull", "4.2.2", "soft_bounce"),
        ("Transient", "General", None, "soft_bounce"),
        ("Transient", "MessageTooLarge", "4.3.4", "soft_bounce"),
        # A "transient" bounce with a permanent SMTP status counts as permanent.
        ("Transient", "MailboxFull", "5.2.2", "hard_bounce"),
        ("Transient", "General", "5.1.1", "hard_bounce"),
        ("Undetermined", "Undetermined", None, "soft_bounce"),
        ("Undetermined", "Undetermined", "5.0.0", "soft_bounce"),
        ("SomethingNew", "Whatever", None, "soft_bounce"),
    ],
)
def test_transient_and_undetermined_bounces(
    bounce_type: str, subtype: str, status: str | None, expected: str
) -> None:
    event = ses("Bounce", bounce_type=bounce_type, bounce_subtype=subtype, status=status)
    outcome = classify(event).outcome
    assert outcome.name == expected
    if expected == "soft_bounce":
        assert outcome.retry and outcome.soft_bounce and outcome.suppression is None
        assert outcome.state == "transient"


@pytest.mark.parametrize(
    ("feedback", "expected"),
    [("abuse", "complaint"), ("fraud", "complaint"), (None, "complaint"), ("not-spam", "not_spam")],
)
def test_complaints(feedback: str | None, expected: str) -> None:
    outcome = classify(ses("Complaint", feedback_type=feedback)).outcome
    assert outcome.name == expected
    assert outcome.suppression == ("complaint" if expected == "complaint" else None)
    assert outcome.state == ("complained" if expected == "complaint" else None)


@pytest.mark.parametrize(
    ("kind", "name", "state"),
    [
        ("Send", "sent", "sent"),
        ("Delivery", "delivered", "delivered"),
        ("DeliveryDelay", "delayed", "delayed"),
        ("Reject", "failed", "failed"),
        ("Rendering Failure", "failed", "failed"),
        ("Open", "engagement", None),
        ("Click", "engagement", None),
        ("Subscription", "subscription", None),
    ],
)
def test_other_ses_events(kind: str, name: str, state: str | None) -> None:
    outcome = classify(ses(kind)).outcome
    assert (outcome.name, outcome.state, outcome.suppression, outcome.retry) == (
        name,
        state,
        None,
        False,
    )


def test_unknown_ses_types_are_ignored() -> None:
    (event,) = parse_notification({"eventType": "Brand New"}, event_id="u")
    assert classify(event).outcome.name == "ignored"


TWILIO_CODES = {
    "21610": ("opt_out", "sms_stop", False, False),
    "21211": ("invalid_address", "invalid_address", False, False),
    "21614": ("invalid_address", "invalid_address", False, False),
    "30004": ("invalid_address", "invalid_address", False, False),
    "30005": ("invalid_address", "invalid_address", False, False),
    "30006": ("invalid_address", "invalid_address", False, False),
    "30001": ("transient", None, True, False),
    "30003": ("transient", None, True, False),
    "30008": ("transient", None, True, False),
    "30009": ("transient", None, True, False),
    "30007": ("failed", None, False, False),
    "30002": ("account", None, True, True),
    "30032": ("account", None, True, True),
    "30034": ("account", None, True, True),
    "21408": ("destination", None, False, True),
    "21612": ("recipient", None, True, False),
    # Unknown codes: transient, bounded by the retry budget.
    "30044": ("transient", None, True, False),
    # Account-level in a callback as at send time (it used to be retried as transient).
    "30010": ("account", None, True, True),
    "20003": ("account", None, True, True),
    "21635": ("invalid_address", "invalid_address", False, False),
}


@pytest.mark.parametrize("code", sorted(TWILIO_CODES))
@pytest.mark.parametrize("status", ["failed", "undelivered"])
def test_twilio_error_codes(code: str, status: str) -> None:
    outcome = classify(tw(status, code)).outcome
    name, suppression, retry, flag = TWILIO_CODES[code]
    assert (outcome.name, outcome.suppression, outcome.retry, outcome.flag_provider) == (
        name,
        suppression,
        retry,
        flag,
    )
    assert outcome.state == ("transient" if retry else "failed")


@pytest.mark.parametrize(
    ("status", "name"),
    [
        ("queued", "sent"),
        ("accepted", "sent"),
        ("scheduled", "sent"),
        ("sending", "sent"),
        ("sent", "sent"),
        ("delivered", "delivered"),
        ("read", "read"),
        ("canceled", "failed"),
        ("received", "ignored"),
        ("bogus", "ignored"),
    ],
)
def test_twilio_statuses(status: str, name: str) -> None:
    assert classify(tw(status)).outcome.name == name


def test_failure_without_code_is_transient_and_codes_on_success_are_irrelevant() -> None:
    assert classify(tw("undelivered")).rule == "twilio:default"
    assert classify(tw("delivered", "30003")).outcome.name == "delivered"


def test_inbound_is_its_own_class() -> None:
    event = parse_inbound({"MessageSid": "SM1", "Body": "STOP"}, idempotency_token=None)
    assert classify(event).outcome.name == "inbound"


def test_lookup_order_is_most_specific_first() -> None:
    event = ses("Bounce", bounce_type="Transient", bounce_subtype="MailboxFull", status="5.2.2")
    assert table_keys(event) == [
        "ses:bounce:Transient:status_5xx",
        "ses:bounce:Transient:MailboxFull",
        "ses:bounce:Transient",
        "ses:bounce:default",
    ]
    assert table_keys(tw("failed", "30003")) == ["twilio:30003", "twilio:default"]


def test_overrides_replace_table_entries() -> None:
    overrides = {
        "twilio:30003": "invalid_address",  # "suppress after repeated failures" policy
        "ses:bounce:Transient:status_5xx": "soft_bounce",
        "ses:complaint:not-spam": "complaint",
        "twilio:default": "failed",
    }
    assert classify(tw("undelivered", "30003"), overrides).outcome.name == "invalid_address"
    event = ses("Bounce", bounce_type="Transient", status="5.1.1")
    assert classify(event, overrides).outcome.name == "soft_bounce"
    assert classify(ses("Complaint", feedback_type="not-spam"), overrides).outcome.name == (
        "complaint"
    )
    assert classify(tw("failed", "39999"), overrides).outcome.name == "failed"
    # Untouched rows keep their defaults.
    assert classify(tw("failed", "21610"), overrides).outcome.name == "opt_out"


def test_the_table_only_names_known_outcomes() -> None:
    assert set(DEFAULT_TABLE.values()) <= set(OUTCOMES)


def test_override_setting_is_parsed_and_validated() -> None:
    raw = '{"twilio:30003": "invalid_address", "ses:bounce:Undetermined": "hard_bounce"}'
    assert parse_classification_overrides(raw) == {
        "twilio:30003": "invalid_address",
        "ses:bounce:Undetermined": "hard_bounce",
    }
    env = {"GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES": raw}
    assert load_settings(env).webhooks.classification_overrides["twilio:30003"] == (
        "invalid_address"
    )
    for bad in (
        "[1]",
        "not json",
        '{"twilio:1": "nope"}',
        '{"other:1": "failed"}',
        '{"ses:x": "subscription"}',
        '{"twilio:1": 3}',
    ):
        with pytest.raises(SettingsError) as info:
            load_settings({"GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES": bad})
        assert info.value.name == "GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES"


def test_soft_bounce_settings_are_read() -> None:
    settings = load_settings(
        {
            "GATEWAY_SOFT_BOUNCE_THRESHOLD": "5",
            "GATEWAY_SOFT_BOUNCE_WINDOW_SECONDS": "3600",
            "GATEWAY_SOFT_BOUNCE_SUPPRESSION_SECONDS": "60",
            "GATEWAY_FEEDBACK_RETRY_MAX_SECONDS": "7200",
        }
    ).webhooks
    assert (
        settings.soft_bounce_threshold,
        settings.soft_bounce_window_seconds,
        settings.soft_bounce_suppression_seconds,
        settings.feedback_retry_max_seconds,
    ) == (5, 3600.0, 60.0, 7200.0)
    with pytest.raises(SettingsError):
        load_settings({"GATEWAY_SOFT_BOUNCE_THRESHOLD": "0"})
