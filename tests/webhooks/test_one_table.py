"""One table per provider: the send path and the feedback path classify every code alike.

Each provider's codes live in one table (`sender.providers.twilio_spec`,
`sender.providers.ses_spec`). These tests push every code of it through both classifiers,
the send side's (`sender.classify`, a provider call answered the code) and the feedback
side's (`webhooks.classify`, a callback carried it), and fail when the two disagree.
"""

from __future__ import annotations

import pytest

from sender.classify import SendOutcome
from sender.classify import classify as classify_send
from sender.providers import ses_spec, twilio_spec
from sender.providers.codes import (
    ACCOUNT,
    DESTINATION,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    RECIPIENT,
    TRANSIENT,
)
from webhooks.classify import classify as classify_feedback
from webhooks.events import FeedbackEvent
from webhooks.ses import parse_notification
from webhooks.twilio import parse_status

# What each feedback outcome means in the send side's classes.
CLASS_OF_OUTCOME = {
    "transient": TRANSIENT,
    "soft_bounce": TRANSIENT,
    "failed": PERMANENT_MESSAGE,
    "invalid_address": PERMANENT_ADDRESS,
    "hard_bounce": PERMANENT_ADDRESS,
    "opt_out": PERMANENT_ADDRESS,
    "recipient": RECIPIENT,
    "destination": DESTINATION,
    "account": ACCOUNT,
}


def twilio_callback(code: str, status: str = "undelivered") -> FeedbackEvent:
    params = {"MessageSid": "SM1", "MessageStatus": status, "ErrorCode": code, "To": "+1500"}
    return parse_status(params, query={}, idempotency_token=None)


def test_the_table_is_the_whole_twilio_vocabulary() -> None:
    # Nothing else in either classifier names a Twilio code.
    from webhooks.classify import DEFAULT_TABLE

    feedback_codes = {
        key.split(":")[1]
        for key in DEFAULT_TABLE
        if key.startswith("twilio:") and key.split(":")[1].isdigit()
    }
    assert feedback_codes == set(twilio_spec.CODES)


@pytest.mark.parametrize("code", sorted(twilio_spec.CODES))
@pytest.mark.parametrize("status", ["failed", "undelivered"])
def test_every_twilio_code_is_classified_alike_in_both_directions(code: str, status: str) -> None:
    sent = classify_send(SendOutcome("twilio", error_code=code, http_status=400))
    fed = classify_feedback(twilio_callback(code, status))
    assert fed.rule == f"twilio:{code}" and sent.key == f"twilio:{code}"
    assert CLASS_OF_OUTCOME[fed.outcome.name] == sent.kind, code
    # The consequences match too: the same suppression reason, and an account-level code
    # opens the circuit on both sides.
    assert fed.outcome.suppression == sent.suppression_reason
    assert fed.outcome.opens_circuit == (sent.kind == ACCOUNT)


def test_30010_is_account_level_in_both_directions() -> None:
    # The drift the issue found: a status callback carrying 30010 used to be retried as
    # transient and never flagged the provider.
    fed = classify_feedback(twilio_callback("30010")).outcome
    assert (fed.name, fed.flag_provider, fed.opens_circuit, fed.suppression) == (
        "account",
        True,
        True,
        None,
    )
    assert classify_send(SendOutcome("twilio", error_code="30010")).kind == ACCOUNT


def ses_bounce(key: str) -> FeedbackEvent:
    parts = key.split(":")[1:]
    bounce: dict[str, object] = {"bounceType": parts[0] if parts[0] != "default" else "Odd"}
    recipient: dict[str, object] = {"emailAddress": "jane@example.com"}
    if len(parts) > 1 and parts[1] == "status_5xx":
        recipient["status"] = "5.1.1"
    elif len(parts) > 1:
        bounce["bounceSubType"] = parts[1]
    bounce["bouncedRecipients"] = [recipient]
    message = {"eventType": "Bounce", "mail": {"messageId": "m1"}, "bounce": bounce}
    (event,) = parse_notification(message, event_id="e1")
    return event


def ses_event(key: str) -> FeedbackEvent:
    if key.startswith("bounce:"):
        return ses_bounce(key)
    kind = {"reject": "Reject", "rendering_failure": "Rendering Failure"}[key]
    message = {"eventType": kind, "mail": {"messageId": "m1", "destination": ["j@example.com"]}}
    (event,) = parse_notification(message, event_id="e2")
    return event


@pytest.mark.parametrize("key", sorted(ses_spec.FEEDBACK))
def test_every_ses_feedback_condition_is_classified_by_its_class(key: str) -> None:
    fed = classify_feedback(ses_event(key))
    assert fed.rule == f"ses:{key}"
    assert CLASS_OF_OUTCOME[fed.outcome.name] == ses_spec.FEEDBACK[key][0]


@pytest.mark.parametrize(("code", "key"), sorted(ses_spec.SAME_CONDITION.items()))
def test_ses_conditions_seen_both_ways_are_classified_alike(code: str, key: str) -> None:
    sent = classify_send(SendOutcome("ses", error_code=code, http_status=400))
    fed = classify_feedback(ses_event(key))
    assert sent.kind == CLASS_OF_OUTCOME[fed.outcome.name] == ses_spec.CODES[code][0]
