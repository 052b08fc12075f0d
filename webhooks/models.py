"""The provider event store: every verified callback, once, with what was done with it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import DateTime, ForeignKey, Index, String, Text, UniqueConstraint, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from suppression.db import Base, new_id, utcnow


class ProviderEvent(Base):
    """A normalized provider event; the raw payload is kept encrypted (it holds addresses)."""

    __tablename__ = "provider_events"
    __table_args__ = (
        UniqueConstraint("provider", "provider_event_id", name="uq_provider_events_provider_event"),
        Index(
            "ix_provider_events_parked",
            "provider_message_id",
            postgresql_where=text("disposition = 'parked'"),
        ),
        Index("ix_provider_events_recipient", "recipient_hash", "received_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    provider: Mapped[str] = mapped_column(String(32))
    provider_event_id: Mapped[str] = mapped_column(Text)
    # Normalized type: sent, delayed, delivered, bounced, soft_bounced, complained, failed,
    # opened, clicked, subscription, inbound, unknown, ...
    event_type: Mapped[str] = mapped_column(String(32))
    provider_message_id: Mapped[str | None] = mapped_column(Text)
    delivery_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("deliveries.id", ondelete="SET NULL"), index=True
    )
    attempt_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("attempts.id", ondelete="SET NULL")
    )
    recipient_hash: Mapped[str | None] = mapped_column(String(64))
    # applied | duplicate | regression | parked | ignored
    disposition: Mapped[str] = mapped_column(String(16))
    # Non-personal normalized facts (bounce type, error code, feedback type, ...).
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    # Fernet ciphertext of the raw payload; NULL after erasure of its subject.
    payload_encrypted: Mapped[str | None] = mapped_column(Text)
    occurred_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    received_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
