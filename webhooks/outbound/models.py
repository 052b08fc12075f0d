"""Tables of the push side: endpoints, one delivery per (endpoint, event), and every try.

All statements on them are in `webhooks.outbound.store` (the owning module); these typed
models serve the migrations.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import (
    Boolean,
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
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from suppression.db import Base, new_id, utcnow


class WebhookEndpoint(Base):
    """An upstream URL that receives the events of one API key, signed with its secret."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    # Event types it subscribed to, or ["*"] for all.
    events: Mapped[list[str]] = mapped_column(ARRAY(String(64)))
    # Whose events it receives (visibility as that API key's); not a foreign key: api_keys
    # belongs to the composition root, which checks the key when the endpoint is made.
    api_key_id: Mapped[uuid.UUID] = mapped_column()
    # Fernet ciphertexts of the `whsec_` signing secrets; the previous one signs beside the
    # current one until `previous_secret_expires_at` (rotation).
    secret_encrypted: Mapped[str] = mapped_column(Text)
    previous_secret_encrypted: Mapped[str | None] = mapped_column(Text)
    previous_secret_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # `operator` (PATCH / CLI) or `failing` (every try failed for the failure window).
    disabled_reason: Mapped[str | None] = mapped_column(String(16))
    disabled_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Since when every try has failed (NULL after a success).
    failing_since: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Position in the event feed up to which events were fanned out to this endpoint.
    feed_cursor: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint: pending until a 2xx (`delivered`) or the schedule's end
    (`failed`)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_endpoint_event"),
        # Serves the claim: due rows per endpoint (a bounded number each).
        Index(
            "ix_webhook_deliveries_due",
            "endpoint_id",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("ix_webhook_deliveries_occurred", "endpoint_id", "occurred_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    # The event's id: the `webhook-id` header, the same on every try.
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    occurred_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    # The JSON body of an event that is not in the feed (`ping`); NULL: the feed's event is
    # read at each try (its payload stays with the feed, which owns its retention and erasure).
    body: Mapped[str | None] = mapped_column(Text)
    # pending | delivered | failed
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Set while a worker pushes it: until then no other worker claims it, after it (the
    # worker died) any may.
    leased_until: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_attempt_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(SmallInteger)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookAttempt(Base):
    """One HTTP try of a delivery: status code (NULL when no answer), latency, error."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_endpoint", "endpoint_id", "attempted_at"),)

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    delivery_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    attempted_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    status_code: Mapped[int | None] = mapped_column(SmallInteger)
    latency_ms: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
