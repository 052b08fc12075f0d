"""Classification of send-time outcomes (pure): the tables, the fallbacks and the overrides."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sender.classify import (
    ACCEPTED,
    ACCOUNT,
    CLASSES,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    SES_TABLE,
    TRANSIENT,
    TWILIO_TABLE,
    UNKNOWN_OUTCOME,
    SendOutcome,
    classify,
    parse_overrides,
)

# PROVIDERS.md section 3 (SES) and section 4 (Twilio), row by row.
SES_EXPECTED = {
    "TooManyRequestsException": TRANSIENT,
    "LimitExceededException": ACCOUNT,
    "AccountSuspendedException": ACCOUNT,
    "SendingPausedException": ACCOUNT,
    "MessageRejected": PERMANENT_MESSAGE,
    "MailFromDomainNotVerifiedException": ACCOUNT,
    "NotFoundException": ACCOUNT,
    "BadRequestException": PERMANENT_MESSAGE,
}
TWILIO_EXPECTED = {
    "21211": PERMANENT_ADDRESS,
    "21408": DESTINATION,
    "21608": DESTINATION,
    "21610": PERMANENT_ADDRESS,
    "21612": RECIPIENT,
    "21614": PERMANENT_ADDRESS,
    "21635": PERMANENT_ADDRESS,
    "30001": TRANSIENT,
    "30002": ACCOUNT,
    "30003": TRANSIENT,
    "30004": PERMANENT_ADDRESS,
    "30005": PERMANENT_ADDRESS,
    "30006": PERMANENT_ADDRESS,
    "30007": PERMANENT_MESSAGE,
    "30008": TRANSIENT,
    "30009": TRANSIENT,
    "30010": ACCOUNT,
    "30032": ACCOUNT,
    "30034": ACCOUNT,
    "20429": TRANSIENT,
}


@pytest.mark.parametrize(("code", "kind"), sorted(SES_EXPECTED.items()))
def test_ses_table(code: str, kind: str) -> None:
    verdict = classify(SendOutcome("ses", error_code=code, http_status=400))
    assert (verdict.kind, verdict.key) == (kind, f"ses:{code}")
    assert verdict.suppression_reason is None  # SES never names a bad address at send time


@pytest.mark.parametrize(("code", "kind"), sorted(TWILIO_EXPECTED.items()))
def test_twilio_table(code: str, kind: str) -> None:
    verdict = classify(SendOutcome("twilio", error_code=code, http_status=400))
    assert (verdict.kind, verdict.key) == (kind, f"twilio:{code}")
    expected = None
    if kind == PERMANENT_ADDRESS:
        expected = "sms_stop" if code == "21610" else "invalid_address"
    assert verdict.suppression_reason == expected


def test_every_table_entry_has_a_known_class() -> None:
    for kind, description in [*SES_TABLE.values(), *TWILIO_TABLE.values()]:
        assert kind in CLASSES and kind != ACCEPTED and description


def test_accepted() -> None:
    verdict = classify(SendOutcome("ses", provider_message_id="m-1"))
    assert verdict.kind == ACCEPTED and verdict.retry_after is None


@pytest.mark.parametrize("provider", ["ses", "twilio"])
def test_http_fallbacks(provider: str) -> None:
    throttled = classify(SendOutcome(provider, http_status=429, retry_after=7.0))
    assert (throttled.kind, throttled.retry_after) == (TRANSIENT, 7.0)
    assert throttled.key == f"{provider}:http_429"
    for status in (500, 502, 503, 504):
        verdict = classify(SendOutcome(provider, error_code=str(status), http_status=status))
        assert (verdict.kind, verdict.key) == (TRANSIENT, f"{provider}:http_5xx")
    unknown = classify(SendOutcome(provider, error_code="SomethingNew", http_status=400))
    assert (unknown.kind, unknown.key) == (TRANSIENT, f"{provider}:default")


@pytest.mark.parametrize("provider", ["ses", "twilio"])
def test_transport_failures(provider: str) -> None:
    after = classify(SendOutcome(provider, transport="after_send", message="read timeout"))
    assert (after.kind, after.key) == (UNKNOWN_OUTCOME, f"{provider}:connection_after_send")
    before = classify(SendOutcome(provider, transport="not_sent"))
    assert (before.kind, before.key) == (TRANSIENT, f"{provider}:connection_not_sent")


def test_retry_after_is_kept_only_where_a_retry_follows() -> None:
    assert (
        classify(SendOutcome("ses", error_code="SendingPausedException", retry_after=5)).retry_after
        == 5
    )
    assert (
        classify(SendOutcome("ses", error_code="MessageRejected", retry_after=5)).retry_after
        is None
    )


def test_overrides_win_at_every_level() -> None:
    overrides = {
        "twilio:30007": PERMANENT_ADDRESS,
        "twilio:http_500": UNKNOWN_OUTCOME,
        "ses:default": PERMANENT_MESSAGE,
        "*:connection_not_sent": ACCOUNT,
    }
    filtered = classify(SendOutcome("twilio", error_code="30007"), overrides)
    assert (filtered.kind, filtered.suppression_reason) == (PERMANENT_ADDRESS, "invalid_address")
    five = classify(SendOutcome("twilio", http_status=500), overrides)
    assert (five.kind, five.key) == (UNKNOWN_OUTCOME, "twilio:http_500")
    assert classify(SendOutcome("twilio", http_status=503), overrides).kind == TRANSIENT
    assert (
        classify(SendOutcome("ses", error_code="Odd", http_status=400), overrides).kind
        == PERMANENT_MESSAGE
    )
    assert classify(SendOutcome("ses", transport="not_sent"), overrides).kind == ACCOUNT
    # The code wins over the HTTP status.
    assert (
        classify(SendOutcome("ses", error_code="MessageRejected", http_status=500)).kind
        == PERMANENT_MESSAGE
    )


def test_reason_names_the_rule() -> None:
    verdict = classify(SendOutcome("twilio", error_code="21211"))
    assert verdict.reason == "twilio:21211 invalid 'To' number"


def test_parse_overrides() -> None:
    assert parse_overrides(None) == {}
    assert parse_overrides("  ") == {}
    assert parse_overrides('{"twilio:30007": "permanent_message"}') == {
        "twilio:30007": PERMANENT_MESSAGE
    }
    for bad in (
        "[1]",
        "{",
        '{"30007": "transient"}',
        '{"twilio:1": "accepted"}',
        '{"ses:X": "nope"}',
    ):
        with pytest.raises(ValueError):
            parse_overrides(bad)


@given(
    provider=st.sampled_from(["ses", "twilio", "other"]),
    message_id=st.none() | st.text(min_size=1, max_size=8),
    code=st.none() | st.text(max_size=12),
    status=st.none() | st.integers(100, 599),
    transport=st.none() | st.sampled_from(["not_sent", "after_send"]),
    retry_after=st.none() | st.floats(0, 1e6),
)
def test_every_outcome_gets_exactly_one_class(
    provider: str,
    message_id: str | None,
    code: str | None,
    status: int | None,
    transport: str | None,
    retry_after: float | None,
) -> None:
    outcome = SendOutcome(
        provider,
        provider_message_id=message_id,
        error_code=code,
        http_status=status,
        transport=transport,  # type: ignore[arg-type]
        retry_after=retry_after,
    )
    verdict = classify(outcome)
    assert verdict.kind in CLASSES
    assert (verdict.kind == ACCEPTED) == outcome.accepted
    if transport == "after_send":
        assert verdict.kind == UNKNOWN_OUTCOME
    assert (verdict.suppression_reason is not None) == (verdict.kind == PERMANENT_ADDRESS)
