"""SES parsing: every genuine payload, both shapes, one event per recipient, no PII in details."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from tests.webhooks.feedback import SES_FILES, ses_event, ses_payload
from webhooks.errors import MalformedPayload
from webhooks.ses import parse_notification


@pytest.mark.parametrize("name", sorted(SES_FILES))
def test_every_genuine_payload_parses(name: str) -> None:
    event_type, count = SES_FILES[name]
    message = ses_payload(name)
    events = parse_notification(message, event_id="sns-1")
    assert [e.event_type for e in events] == [event_type] * count
    assert {e.provider for e in events} == {"ses"}
    assert {e.channel for e in events} == {"email"}
    assert all(e.provider_message_id == message["mail"]["messageId"] for e in events)
    assert all(e.raw == message for e in events)
    assert all(e.occurred_at is not None and e.occurred_at.tzinfo for e in events)
    ids = [e.provider_event_id for e in events]
    assert ids == (["sns-1"] if count == 1 else [f"sns-1#{i}" for i in range(count)])
    # Nothing personal in the details that are stored in plaintext.
    flat = json.dumps([e.details for e in events])
    assert "@" not in flat


def test_both_shapes_of_a_bounce_give_the_same_facts() -> None:
    kwargs = {"message_id": "m-1", "recipients": ("Jane@Example.COM",), "status": "5.1.1"}
    event = parse_notification(ses_event("Bounce", **kwargs), event_id="e")  # type: ignore[arg-type]
    note = parse_notification(ses_event("Bounce", shape="notification", **kwargs), event_id="e")  # type: ignore[arg-type]
    for parsed in (event, note):
        (one,) = parsed
        assert one.event_type == "bounce"
        assert one.details["bounce_type"] == "Permanent"
        assert one.details["bounce_subtype"] == "General"
        assert one.details["status"] == "5.1.1"
        assert one.details["diagnostic"] == "smtp; 550 5.1.1 <[address]>... User unknown"
        assert one.recipient is not None and one.recipient.key == "jane@example.com"
    assert event[0].details["ses_type"] == note[0].details["ses_type"] == "Bounce"


@pytest.mark.parametrize(
    ("kind", "event_type"),
    [("Bounce", "bounce"), ("Complaint", "complaint"), ("Delivery", "delivery")],
)
def test_notification_and_event_shapes_agree(kind: str, event_type: str) -> None:
    event = ses_event(kind, message_id="m-2", delivery_ref="ref")
    note = ses_event(kind, message_id="m-2", delivery_ref="ref", shape="notification")
    assert "eventType" in event and "notificationType" in note
    (a,) = parse_notification(event, event_id="e")
    (b,) = parse_notification(note, event_id="e")
    assert (a.event_type, b.event_type) == (event_type, event_type)
    assert (a.provider_message_id, a.recipient) == (b.provider_message_id, b.recipient)
    assert a.details == b.details
    # Tags exist only with event publishing.
    assert (a.delivery_ref, b.delivery_ref) == ("ref", None)


def test_multi_recipient_bounce_gets_suffixed_ids_and_per_recipient_status() -> None:
    message = ses_payload("awsdocs-notification-bounce-permanent-general-no-dsn.json")
    events = parse_notification(message, event_id="abc")
    assert [e.provider_event_id for e in events] == ["abc#0", "abc#1"]
    assert [e.recipient.key for e in events if e.recipient] == [
        "jane@example.com",
        "richard@example.com",
    ]
    assert all("status" not in e.details for e in events)


def test_subtypes_and_feedback_details() -> None:
    (suppressed,) = parse_notification(
        ses_payload("aerendir-real-notification-bounce-permanent-suppressed-simulator.json"),
        event_id="x",
    )
    assert suppressed.details["bounce_subtype"] == "Suppressed"
    assert suppressed.recipient is not None
    assert suppressed.recipient.key == "suppressionlist@simulator.amazonses.com"
    (complaint,) = parse_notification(
        ses_payload("djangoses-real-event-complaint-abuse-simulator.json"), event_id="y"
    )
    assert complaint.details["feedback_type"] == "abuse"
    assert "complaint_subtype" not in complaint.details  # null in the payload
    (no_feedback,) = parse_notification(
        ses_payload("awsdocs-notification-complaint-no-feedback.json"), event_id="z"
    )
    assert "feedback_type" not in no_feedback.details
    (delay,) = parse_notification(ses_payload("awsdocs-event-deliverydelay.json"), event_id="d")
    assert delay.details["delay_type"] == "TransientCommunicationFailure"
    assert delay.details["status"] == "4.4.1"
    (failure,) = parse_notification(
        ses_payload("awsdocs-event-rendering-failure.json"), event_id="r"
    )
    assert failure.details["template"] == "MyTemplate"


def test_subscription_event_lists_topics() -> None:
    (event,) = parse_notification(ses_payload("awsdocs-event-subscription.json"), event_id="s")
    assert event.details["unsubscribe_all"] is True
    assert event.details["contact_list"] == "ContactListName"
    assert event.details["topics"] == [{"topic": "ExampleTopicName", "status": "OptOut"}]
    assert event.recipient is not None and event.recipient.key == "recipient@example.com"


def test_delivery_ref_from_tag_else_header() -> None:
    tagged = ses_event(
        "Delivery", message_id="m", delivery_ref="11111111-1111-1111-1111-111111111111"
    )
    (event,) = parse_notification(tagged, event_id="t")
    assert event.delivery_ref == "11111111-1111-1111-1111-111111111111"
    headed = ses_event("Delivery", message_id="m")
    headed["mail"]["headers"].append({"name": "X-Gateway-Delivery", "value": "derived-key-abc"})
    (event,) = parse_notification(headed, event_id="t")
    assert event.delivery_ref == "derived-key-abc"
    (plain,) = parse_notification(ses_event("Delivery", message_id="m"), event_id="t")
    assert plain.delivery_ref is None


def test_open_and_click_name_a_recipient_only_when_certain() -> None:
    (one,) = parse_notification(ses_payload("awsdocs-event-open.json"), event_id="o")
    assert one.recipient is not None
    several = ses_event("Open", message_id="m", recipients=("a@example.com", "b@example.com"))
    (event,) = parse_notification(several, event_id="o")
    assert event.recipient is None and event.provider_event_id == "o"


def test_unknown_types_become_one_unknown_event() -> None:
    for message in (
        {"notificationType": "AmazonSnsSubscriptionSucceeded", "message": "hi"},
        {"eventType": "SomethingNew", "mail": {"messageId": "m", "destination": ["a@b.example"]}},
        {"unparsed_message": "Successfully validated SNS topic for Amazon SES"},
    ):
        (event,) = parse_notification(message, event_id="u")
        assert event.event_type == "unknown"
        assert event.provider_event_id == "u"
        assert event.recipient is None


def test_unusable_addresses_and_garbage_fields_are_tolerated() -> None:
    message = ses_event("Bounce", message_id="m", recipients=("not an address",))
    message["bounce"]["timestamp"] = "yesterday"
    (event,) = parse_notification(message, event_id="g")
    assert event.recipient is None and event.details["recipient_unusable"] is True
    assert event.occurred_at == dt.datetime(2017, 8, 5, 0, 40, 2, 12000, tzinfo=dt.UTC)
    message = ses_event("Bounce", message_id="m")
    message["bounce"]["bouncedRecipients"] = "nope"
    (event,) = parse_notification(message, event_id="g")  # falls back to mail.destination
    assert event.recipient is not None


def test_a_non_object_is_malformed() -> None:
    with pytest.raises(MalformedPayload):
        parse_notification(["not", "an", "object"], event_id="x")  # type: ignore[arg-type]
