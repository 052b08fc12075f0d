"""Request and response documents of the send API (msgspec structs: parsing and OpenAPI)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

import msgspec

Channel = Literal["email", "sms"]
Category = Literal["transactional", "marketing"]
Priority = Literal["high", "normal", "low"]
# Answer fields, as types so that the OpenAPI document lists their values
# (tests/test_enums.py checks them against sender.status and the README).
DeliveryStatusName = Literal[
    "queued",
    "sending",
    "unknown",
    "retrying",
    "sent",
    "delayed",
    "delivered",
    "read",
    "bounced",
    "complained",
    "failed",
    "suppressed",
    "dead",
    "cancelled",
]
AttemptStatusName = Literal["in_progress", "accepted", "transient", "failed", "deferred", "unknown"]
DispositionName = Literal["applied", "duplicate", "regression", "parked", "ignored"]

MAX_RECIPIENTS = 100
MAX_METADATA_KEYS = 20
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 256
MAX_ADDRESS = 320
# `Display Name <address>`: the address and a name of a reasonable length.
MAX_FROM = 512
MAX_REPLY_TO = 10
# RFC 5322's line limit: the subject is one header line.
MAX_SUBJECT = 998
# Characters of the text and of the HTML part of an email (Gmail clips HTML past ~100 KB; the
# whole request is also bounded by GATEWAY_MAX_BODY_BYTES).
MAX_EMAIL_PART = 500_000
# Twilio's limit for one message body (it splits longer ones into segments).
MAX_SMS_BODY = 1600
MAX_TOPIC = 128

# Top-level fields that are multi-line body text: tab, line feed and carriage return are
# allowed there and nowhere else (the gateway's input gate reads this from the route's
# `opt["multiline_fields"]`). Everything else ends in a header, a tag or a column.
MULTILINE_FIELDS = ("text", "html", "body")

Address = Annotated[str, msgspec.Meta(max_length=MAX_ADDRESS)]
# Not constrained while decoding: the published schema cannot state a map's key lengths
# (nor, as generated, its values'), so a key of 0 or more than MAX_METADATA_KEY characters,
# or a value beyond MAX_METADATA_VALUE, is schema-valid and must be answered 422 by the
# service's own check (`SendService._check_rest`), not 400 by the decoder. The body size
# limit bounds them meanwhile.
MetadataKey = str
MetadataValue = str


class MessageContent(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The content and options of a message: `POST /v1/messages` without `to`, which is the
    body of `POST /v1/campaigns` as it stands (see `SendMessage`, `CreateCampaign`).

    No field may hold NUL, another C0 control character or a lone surrogate; tab and line
    breaks only in `text`, `html` and `body` (422 otherwise).
    """

    channel: Channel
    from_: Annotated[str, msgspec.Meta(max_length=MAX_FROM)] | None = msgspec.field(
        default=None, name="from"
    )
    subject: Annotated[str, msgspec.Meta(max_length=MAX_SUBJECT)] | None = None
    text: Annotated[str, msgspec.Meta(max_length=MAX_EMAIL_PART)] | None = None
    html: Annotated[str, msgspec.Meta(max_length=MAX_EMAIL_PART)] | None = None
    reply_to: Annotated[list[Address], msgspec.Meta(max_length=MAX_REPLY_TO)] | Address | None = (
        None
    )
    body: Annotated[str, msgspec.Meta(max_length=MAX_SMS_BODY)] | None = None
    category: Category = "transactional"
    topic: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TOPIC)] | None = None
    priority: Priority = "normal"
    expires_at: dt.datetime | None = None
    metadata: (
        Annotated[dict[MetadataKey, MetadataValue], msgspec.Meta(max_length=MAX_METADATA_KEYS)]
        | None
    ) = None


class SendMessage(MessageContent, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/messages`: the content and options (`MessageContent`) and `to`."""

    to: Annotated[list[Address], msgspec.Meta(min_length=1, max_length=MAX_RECIPIENTS)]


class DeliveryAnswer(msgspec.Struct, kw_only=True):
    """One delivery in the answer to a send."""

    id: uuid.UUID
    to: str | None
    status: DeliveryStatusName
    reason: str | None = None


class MessageCreated(msgspec.Struct, kw_only=True):
    """Answer to `POST /v1/messages` (201: every delivery has its first answer; 202: some
    are deferred)."""

    id: uuid.UUID
    deliveries: list[DeliveryAnswer]


class AttemptView(msgspec.Struct, kw_only=True):
    """One provider call."""

    number: int
    status: AttemptStatusName
    provider: str
    provider_message_id: str | None
    provider_status: str | None
    error_code: str | None
    error: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None


class EventView(msgspec.Struct, kw_only=True):
    """One provider callback about the delivery and what was done with it."""

    id: uuid.UUID
    provider: str
    provider_event_id: str
    event_type: str
    provider_message_id: str | None
    disposition: DispositionName
    details: dict[str, Any]
    occurred_at: dt.datetime | None
    received_at: dt.datetime


class SuppressionView(msgspec.Struct, kw_only=True):
    """The suppression-list entry that stopped a delivery (None fields once it was removed)."""

    id: uuid.UUID
    active: bool
    reason: str | None = None
    scope: str | None = None
    created_at: dt.datetime | None = None
    expires_at: dt.datetime | None = None


class DeliveryView(msgspec.Struct, kw_only=True):
    """A delivery with its attempts, provider events and the suppression that stopped it."""

    id: uuid.UUID
    to: str | None
    status: DeliveryStatusName
    reason: str | None
    provider: str | None
    provider_message_id: str | None
    derived_key: str
    attempts_made: int
    next_attempt_at: dt.datetime | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    attempts: list[AttemptView]
    events: list[EventView]
    suppression: SuppressionView | None


class MessageView(msgspec.Struct, kw_only=True):
    """Answer to `GET /v1/messages/{id}`."""

    id: uuid.UUID
    channel: Channel
    category: Category
    topic: str | None
    priority: Priority
    expires_at: dt.datetime | None
    metadata: dict[str, Any]
    state: str
    response_code: int | None
    created_at: dt.datetime
    completed_at: dt.datetime | None
    # True when `deliveries` holds only the first 1,000 (a campaign's message).
    deliveries_truncated: bool = False
    deliveries: list[DeliveryView]


class DeliveryStatusView(msgspec.Struct, kw_only=True):
    """A delivery's recipient and status, as message search lists it."""

    id: uuid.UUID
    to: str | None
    status: DeliveryStatusName
    reason: str | None


class MessageSummary(msgspec.Struct, kw_only=True):
    """One message found by `GET /v1/messages`, with its deliveries' statuses."""

    id: uuid.UUID
    channel: Channel
    category: Category
    topic: str | None
    priority: Priority
    metadata: dict[str, Any]
    state: str
    created_at: dt.datetime
    completed_at: dt.datetime | None
    deliveries: list[DeliveryStatusView]


class MessagePage(msgspec.Struct, kw_only=True):
    """Answer to `GET /v1/messages`: newest first; `next_cursor` is None on the last page."""

    items: list[MessageSummary]
    next_cursor: str | None


# -- campaigns ------------------------------------------------------------------------------

CampaignStateName = Literal["draft", "expanding", "sending", "done", "cancelled"]


class CreateCampaign(MessageContent, forbid_unknown_fields=True, kw_only=True):
    """Body of `POST /v1/campaigns`: the content and options of `POST /v1/messages` without
    `to` (the recipients come with `PUT /v1/campaigns/{id}/recipients`), under the same rules.
    """


class CampaignCreated(msgspec.Struct, kw_only=True):
    """Answer to `POST /v1/campaigns` (a replay answers the campaign's current state)."""

    id: uuid.UUID
    state: CampaignStateName


class RecipientsLoaded(msgspec.Struct, kw_only=True):
    """Answer to `PUT /v1/campaigns/{id}/recipients`: records read (valid or not), records
    refused (invalid address, malformed line), and repeats of an address already listed."""

    recipients_read: int
    invalid: int
    duplicates: int


class CampaignCounts(msgspec.Struct, kw_only=True):
    """What became of a campaign's list: the upload's counts (`read`, `invalid`,
    `duplicate`) and its deliveries by status (`queued` counts every one not final yet)."""

    read: int
    invalid: int
    duplicate: int
    suppressed: int
    queued: int
    sent: int
    delivered: int
    bounced: int
    complained: int
    failed: int
    cancelled: int


class CampaignView(msgspec.Struct, kw_only=True):
    """Answer to `GET /v1/campaigns/{id}`."""

    id: uuid.UUID
    message_id: uuid.UUID
    state: CampaignStateName
    channel: Channel
    category: Category
    topic: str | None
    priority: Priority
    expires_at: dt.datetime | None
    metadata: dict[str, Any]
    counts: CampaignCounts
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class CampaignSummary(msgspec.Struct, kw_only=True):
    """A campaign in `GET /v1/campaigns` (its delivery counts: `GET /v1/campaigns/{id}`)."""

    id: uuid.UUID
    message_id: uuid.UUID
    state: CampaignStateName
    channel: Channel
    category: Category
    recipients_read: int
    invalid: int
    duplicates: int
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class CampaignPage(msgspec.Struct, kw_only=True):
    """A page of campaigns, newest first; pass `next_cursor` as `cursor` for the next one."""

    items: list[CampaignSummary]
    next_cursor: str | None
