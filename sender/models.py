"""Tables of the delivery log: upstream messages, their deliveries and provider attempts."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from suppression.db import Base, new_id, utcnow


class Message(Base):
    """One upstream send request, unique per (client, Idempotency-Key)."""

    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("client_id", "idempotency_key", name="uq_messages_client_idempotency_key"),
        # Message search (`GET /v1/messages`): a key's own messages newest first, and all of
        # them for admin keys.
        Index("ix_messages_client_created", "client_id", "created_at", "id"),
        Index("ix_messages_created", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    client_id: Mapped[uuid.UUID] = mapped_column()
    idempotency_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    # `in_progress` while the first request runs (a duplicate then gets 409), then `completed`.
    state: Mapped[str] = mapped_column(String(16), default="in_progress")
    channel: Mapped[str] = mapped_column(String(16))
    category: Mapped[str] = mapped_column(String(16), default="transactional")
    topic: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[str] = mapped_column(String(8), default="normal")
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Content without recipients (they live encrypted on the deliveries).
    content_encrypted: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, default=dict)
    response_code: Mapped[int | None] = mapped_column(SmallInteger)
    # The first answer per delivery, for idempotent replays: [{"id", "status", "reason"}] in
    # request order. No addresses: the replay decrypts them from the deliveries.
    first_answers: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONB)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    completed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # The id of the HTTP request that created it (X-Request-Id or generated): the worker's
    # attempts and log lines for its deliveries carry it too.
    request_id: Mapped[str | None] = mapped_column(String(128))


class Delivery(Base):
    """One (message, channel, recipient): the unit that is sent, retried and tracked."""

    __tablename__ = "deliveries"
    __table_args__ = (
        # Serves the retry worker: due rows only, highest priority first, then oldest due time.
        Index(
            "ix_deliveries_due",
            text("priority_rank DESC"),
            "next_attempt_at",
            postgresql_where=text("next_attempt_at IS NOT NULL"),
        ),
        Index("ix_deliveries_recipient_hash", "channel", "recipient_hash"),
        # Time windows (the console's overview, the reputation guard's window, the stale
        # report): BRIN, a few pages for the whole table and next to nothing per insert,
        # since rows arrive in creation order.
        Index("ix_deliveries_created_brin", "created_at", postgresql_using="brin"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    message_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), index=True
    )
    # Index of the recipient in the request's `to` list (a campaign's: in its uploaded list).
    position: Mapped[int] = mapped_column(Integer, default=0)
    channel: Mapped[str] = mapped_column(String(16))
    recipient_hash: Mapped[str] = mapped_column(String(64))
    # Fernet ciphertext of the normalized recipient; NULL after erasure.
    recipient_encrypted: Mapped[str | None] = mapped_column(Text)
    derived_key: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    reason: Mapped[str | None] = mapped_column(Text)
    provider: Mapped[str | None] = mapped_column(String(32))
    provider_message_id: Mapped[str | None] = mapped_column(Text, unique=True)
    category: Mapped[str] = mapped_column(String(16), default="transactional")
    topic: Mapped[str | None] = mapped_column(String(128))
    # 2 = high, 1 = normal, 0 = low; the retry worker orders by it.
    priority_rank: Mapped[int] = mapped_column(SmallInteger, default=1)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Set while the delivery waits for the worker (retry, deferral, unknown-outcome settle).
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    suppression_id: Mapped[uuid.UUID | None] = mapped_column()
    # Set by the feedback path when it parks a callback that arrived while this delivery's
    # call was in flight; the send path applies parked events only when it is set.
    parked_feedback: Mapped[bool] = mapped_column(default=False, server_default=text("false"))
    # When the delivery began waiting without any provider answer about it (deferred by a
    # rate limit or an open circuit, paused by an account-level error); NULL once a call was
    # answered. Bounds such waits by GATEWAY_RETRY_MAX_DEFERRAL_SECONDS.
    deferred_since: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # The sending identity the reputation guard counts this delivery under: the From domain
    # of an email, the From number or Messaging Service SID of an SMS (sender.reputation).
    sender_identity: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )


class Attempt(Base):
    """One provider call, written `in_progress` and committed before the call is made."""

    __tablename__ = "attempts"
    __table_args__ = (
        # At most one provider call in flight per delivery.
        Index(
            "uq_attempts_one_in_progress",
            "delivery_id",
            unique=True,
            postgresql_where=text("status = 'in_progress'"),
        ),
        UniqueConstraint("delivery_id", "number", name="uq_attempts_delivery_number"),
        Index(
            "ix_attempts_in_progress_started",
            "started_at",
            postgresql_where=text("status = 'in_progress'"),
        ),
        # Time windows (the console's deferral counts), BRIN as for deliveries.created_at.
        Index("ix_attempts_started_brin", "started_at", postgresql_using="brin"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    delivery_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("deliveries.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    # in_progress | accepted | transient | failed | unknown | deferred
    status: Mapped[str] = mapped_column(String(16), default="in_progress")
    provider: Mapped[str] = mapped_column(String(32))
    provider_message_id: Mapped[str | None] = mapped_column(Text, unique=True)
    # The provider-side state of this attempt (advance-only, see webhooks.state).
    provider_status: Mapped[str | None] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # The id of the request the attempt was made for (the send request's, also for the
    # worker's later attempts of the same delivery).
    request_id: Mapped[str | None] = mapped_column(String(128))


class SandboxMessage(Base):
    """What the sandbox providers accepted (the mailbox) and their simulated callbacks.

    Written only when a sandbox provider is configured; every statement on it lives in
    `sender/mailbox.py`. Addresses and content are personal data: a keyed hash of the
    normalized recipient for the `to` filter, everything else Fernet-encrypted.
    """

    __tablename__ = "sandbox_messages"
    __table_args__ = (
        Index("ix_sandbox_messages_created", "created_at", "id"),
        Index("ix_sandbox_messages_to", "channel", "to_hash", "created_at"),
        # Start-up replay: rows that still have simulated callbacks to deliver.
        Index(
            "ix_sandbox_messages_pending",
            "next_callback_at",
            postgresql_where=text("next_callback_at IS NOT NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    channel: Mapped[str] = mapped_column(String(16))
    # The provider family the sandbox stands in for ("ses", "twilio") and its message id.
    provider: Mapped[str] = mapped_column(String(16))
    provider_message_id: Mapped[str] = mapped_column(Text)
    delivery_id: Mapped[uuid.UUID] = mapped_column()
    to_hash: Mapped[str] = mapped_column(String(64))
    # Fernet ciphertext of the JSON of everything the provider saw (recipient, headers, tags,
    # content, the planned callbacks' payloads); NULL after erasure.
    content_encrypted: Mapped[str | None] = mapped_column(Text)
    # The planned callbacks without personal data: [{"seq", "event", "due_at"}].
    callbacks: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    # What became of each delivered one: [{"seq", "at", "result"}].
    results: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    # Due time of the next callback not yet delivered; NULL when all were.
    next_callback_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))


class Campaign(Base):
    """One content sent to a large recipient list (`POST /v1/campaigns`).

    The content lives on its `messages` row (one per campaign; the campaign's deliveries
    hang off it like any message's). Every statement on it lives in `sender/campaigns.py`.
    """

    __tablename__ = "campaigns"
    __table_args__ = (
        UniqueConstraint(
            "client_id", "idempotency_key", name="uq_campaigns_client_idempotency_key"
        ),
        Index("ix_campaigns_created", "created_at", "id"),
        Index("ix_campaigns_client_created", "client_id", "created_at", "id"),
        # The expansion job's look-up: campaigns with work left (few rows).
        Index(
            "ix_campaigns_active",
            "state",
            postgresql_where=text("state IN ('expanding', 'sending')"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    client_id: Mapped[uuid.UUID] = mapped_column()
    idempotency_key: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[str] = mapped_column(String(64))
    message_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), unique=True
    )
    # draft | expanding | sending | done | cancelled
    state: Mapped[str] = mapped_column(String(16), default="draft")
    # What the last recipient upload counted (records read, invalid ones, duplicates).
    read_count: Mapped[int] = mapped_column(Integer, default=0)
    invalid_count: Mapped[int] = mapped_column(Integer, default=0)
    duplicate_count: Mapped[int] = mapped_column(Integer, default=0)
    # The expansion cursor: every recipient at or below this list position has its delivery
    # (it moves by GATEWAY_CAMPAIGN_BATCH positions a batch and may pass the list's end).
    expanded_position: Mapped[int] = mapped_column(Integer, default=-1)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class CampaignRecipient(Base):
    """One normalized, distinct recipient of a campaign's uploaded list.

    Stored like a delivery's recipient: keyed hash for look-ups (and the suppression check),
    Fernet ciphertext of the address (NULL after erasure), and the derived key the delivery
    gets, so the expansion is set-based SQL without decrypting anything.
    """

    __tablename__ = "campaign_recipients"
    __table_args__ = (
        UniqueConstraint(
            "campaign_id", "recipient_hash", name="uq_campaign_recipients_campaign_id"
        ),
    )

    campaign_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("campaigns.id", ondelete="CASCADE"), primary_key=True
    )
    # The record's index in the uploaded list (0-based; invalid and duplicate records leave
    # gaps), the expansion's cursor and the delivery's `position`.
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    recipient_hash: Mapped[str] = mapped_column(String(64))
    recipient_encrypted: Mapped[str | None] = mapped_column(Text)
    derived_key: Mapped[str] = mapped_column(String(64))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONB)


class ReputationState(Base):
    """The reputation guard's verdict per sending identity (every statement on it lives in
    `sender/reputation.py`): the counts of the last evaluation, the state and since when,
    and an operator's resume (which holds until the rates fall back or `hold_until`)."""

    __tablename__ = "reputation_states"

    identity: Mapped[str] = mapped_column(String(255), primary_key=True)
    channel: Mapped[str] = mapped_column(String(16))
    # ok | marketing_paused | all_paused
    state: Mapped[str] = mapped_column(String(24))
    since: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    # Counts over the window at the last evaluation. Email: bounces and complaints as SES
    # counts them; SMS: failures (in `bounces`) and opt-outs (in `complaints`).
    sends: Mapped[int] = mapped_column(Integer, default=0)
    bounces: Mapped[int] = mapped_column(Integer, default=0)
    complaints: Mapped[int] = mapped_column(Integer, default=0)
    evaluated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    # An operator's resume: pauses up to this level (1 marketing, 2 all) are not applied
    # until the rates fall back under the thresholds or `hold_until` passes.
    hold_level: Mapped[int] = mapped_column(SmallInteger, default=0)
    hold_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    resumed_by: Mapped[str | None] = mapped_column(Text)
    resumed_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    resume_reason: Mapped[str | None] = mapped_column(Text)


class ReputationHistory(Base):
    """Append-only: every change of an identity's reputation state, by the guard or an
    operator, with who, when, why and the rates it saw (`sender/reputation.py`)."""

    __tablename__ = "reputation_history"
    __table_args__ = (Index("ix_reputation_history_identity_at", "identity", "at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    identity: Mapped[str] = mapped_column(String(255))
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    # `guard` for an automatic change, else the operator (api_key:<id>, cli:<user>).
    actor: Mapped[str] = mapped_column(Text)
    from_state: Mapped[str | None] = mapped_column(String(24))
    to_state: Mapped[str] = mapped_column(String(24))
    reason: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)


class Event(Base):
    """The outbox: one row per change of a delivery's status and per suppression add/remove.

    Rows are written only by PostgreSQL triggers that migration 0009 creates on `deliveries`,
    `suppression_history` and `suppressions`, in the transaction of the change they report
    (see `sender/events.py`, which holds every statement that reads or prunes the table).
    `xid` is the writing transaction's id (`pg_current_xact_id()`): the feed serves a row
    only once every transaction with a lower id has finished, so no row is ever skipped.
    """

    __tablename__ = "events"
    __table_args__ = (
        # The feed: (xid, id) is the cursor order.
        Index("ix_events_feed", "xid", "id"),
        # Retention pruning.
        Index("ix_events_occurred_at", "occurred_at"),
        # Erasure and subject access by address.
        Index("ix_events_address", "channel", "address_hash"),
        Index("ix_events_delivery", "delivery_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    xid: Mapped[int] = mapped_column(BigInteger)
    type: Mapped[str] = mapped_column(String(32))
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    # The API key that sent the message (delivery events); NULL for suppression events.
    message_owner: Mapped[uuid.UUID | None] = mapped_column()
    message_id: Mapped[uuid.UUID | None] = mapped_column()
    delivery_id: Mapped[uuid.UUID | None] = mapped_column()
    channel: Mapped[str] = mapped_column(String(16))
    address_hash: Mapped[str] = mapped_column(String(64))
    # Fernet ciphertext of the normalized address (copied from the delivery or suppression
    # entry); NULL after erasure. Decrypted when the event is read or pushed.
    address_encrypted: Mapped[str | None] = mapped_column(Text)
    # The rest of the payload's `data` without personal data (`to`/`address` and the
    # message's `metadata` are added when the event is read).
    data: Mapped[dict[str, Any]] = mapped_column(JSONB)
