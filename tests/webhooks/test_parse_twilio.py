"""Twilio parsing: status callbacks (VA fixture bodies), event ids, inbound keywords."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.webhooks.feedback import twilio_form, twilio_status_bodies
from webhooks.errors import MalformedPayload
from webhooks.twilio import (
    HELP_KEYWORDS,
    START_KEYWORDS,
    STOP_KEYWORDS,
    event_id,
    opt_action,
    parse_inbound,
    parse_status,
)

# The fixture's bodies by name -> the normalized event type we expect.
EXPECTED_TYPES = {
    "MESSAAGE_BODY_WITH_ACCEPTED_STATUS": "accepted",
    "MESSAAGE_BODY_WITH_SCHEDULED_STATUS": "scheduled",
    "MESSAAGE_BODY_WITH_QUEUED_STATUS": "queued",
    "MESSAAGE_BODY_WITH_SENDING_STATUS": "sending",
    "MESSAAGE_BODY_WITH_SENT_STATUS": "sent",
    "MESSAAGE_BODY_WITH_DELIVERED_STATUS": "delivered",
    "MESSAAGE_BODY_WITH_UNDELIVERED_STATUS": "undelivered",
    "MESSAAGE_BODY_WITH_FAILED_STATUS": "failed",
    "MESSAAGE_BODY_WITH_CANCELED_STATUS": "canceled",
    "MESSAAGE_BODY_WITH_FAILED_STATUS_AND_ERROR_CODE_30010": "failed",
    # Without MessageStatus the older SmsStatus field is read.
    "MESSAGE_BODY_WITH_NO_MESSAGE_STATUS": "failed",
    "MESSAGE_BODY_WITH_INVALID_MESSAGE_STATUS": "unknown",
}


@pytest.mark.parametrize("item", twilio_status_bodies(), ids=lambda i: i["name"])
def test_fixture_status_bodies(item: dict[str, object]) -> None:
    params = item["params"]
    assert isinstance(params, dict)
    event = parse_status(params, query={"d": "ref-1"}, idempotency_token=None)
    assert event.event_type == EXPECTED_TYPES[str(item["name"])]
    assert event.provider == "twilio" and event.channel == "sms"
    assert event.provider_message_id == params["MessageSid"]
    assert event.delivery_ref == "ref-1"
    assert event.raw == {"params": params, "query": {"d": "ref-1"}}
    # The recipient is hashed later; details hold no number.
    assert "+" not in json.dumps(event.details)
    if params.get("ErrorCode"):
        assert event.details["error_code"] == params["ErrorCode"]


def test_real_shaped_sent_callback() -> None:
    params = twilio_form("va-status-callback-sent.form.txt")
    event = parse_status(params, query={}, idempotency_token="32e709c9-0e95-47c0-8f0d-c6c868cf6241")
    assert event.event_type == "sent"
    assert event.provider_event_id == "32e709c9-0e95-47c0-8f0d-c6c868cf6241"
    assert event.delivery_ref is None
    assert event.recipient is not None and event.recipient.key == "+11111111111"


def test_event_id_without_token_is_a_hash_of_sid_status_and_code() -> None:
    params = {"MessageSid": "SM1", "MessageStatus": "failed", "ErrorCode": "30003"}
    expected = hashlib.sha256(b"SM1\x00failed\x0030003").hexdigest()
    assert event_id(params, None) == expected == event_id(params, "  ")
    assert event_id({**params, "ErrorCode": "30005"}, None) != expected
    assert event_id({**params, "MessageStatus": "undelivered"}, None) != expected
    assert event_id(params, "tok") == "tok"


def test_status_without_sid_is_malformed() -> None:
    with pytest.raises(MalformedPayload):
        parse_status({"MessageStatus": "sent"}, query={}, idempotency_token=None)


@pytest.mark.parametrize("word", sorted(STOP_KEYWORDS))
def test_stop_keywords_whole_body_any_case(word: str) -> None:
    assert opt_action(word.lower(), None) == ("stop", word)
    assert opt_action(f"  {word.title()}\n", None) == ("stop", word)
    assert opt_action(f"{word} please", None) == (None, None)


def test_start_help_and_plain_messages() -> None:
    for word in START_KEYWORDS:
        assert opt_action(word.lower(), None) == ("start", word)
    for word in HELP_KEYWORDS:
        assert opt_action(word, None) == ("help", word)
    assert opt_action("stopp", None) == (None, None)
    assert opt_action("", None) == (None, None)
    assert opt_action(None, None) == (None, None)


def test_advanced_opt_out_type_wins() -> None:
    # A localized keyword Twilio recognised as STOP; our own list does not know it.
    assert opt_action("ARRET", "STOP") == ("stop", "ARRET")
    assert opt_action("stop", "START") == ("start", "STOP")
    assert opt_action("aide", "HELP") == ("help", "AIDE")
    assert opt_action("whatever", "SOMETHING") == (None, None)


def test_inbound_fixture_and_derived_stop() -> None:
    params = twilio_form("va-inbound-sms.form.txt")
    event = parse_inbound(params, idempotency_token="09f6d617-b893-4864-8f42-24a36ec48691")
    assert event.event_type == "inbound"
    assert "action" not in event.details  # an ordinary message
    assert event.recipient is not None and event.recipient.key == "+18888888888"  # From
    assert event.provider_message_id == params["MessageSid"]
    assert "Body" not in json.dumps(event.details)
    stop = parse_inbound({**params, "Body": "Stop"}, idempotency_token=None)
    assert stop.details["action"] == "stop" and stop.details["keyword"] == "STOP"
    opt = parse_inbound({**params, "Body": "halt", "OptOutType": "stop"}, idempotency_token=None)
    assert opt.details["opt_out_type"] == "STOP" and opt.details["action"] == "stop"


def test_inbound_with_empty_body_keeps_blank_values() -> None:
    params = twilio_form("va-inbound-sms-empty-body.form.txt")
    assert params["Body"] == ""
    event = parse_inbound(params, idempotency_token=None)
    assert "action" not in event.details
    assert event.raw == {"params": params}
