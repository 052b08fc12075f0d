"""Tables of the suppression list and its append-only history."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import BigInteger, DateTime, Index, String, Text, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from suppression.db import Base, new_id, utcnow


class Suppression(Base):
    """One suppressed (channel, address, scope); the address is kept only as hash + ciphertext."""

    __tablename__ = "suppressions"
    __table_args__ = (
        UniqueConstraint("channel", "address_hash", "scope", name="uq_suppressions_address_scope"),
        Index("ix_suppressions_created_at", "created_at"),
    )

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=new_id)
    channel: Mapped[str] = mapped_column(String(16))
    address_hash: Mapped[str] = mapped_column(String(64))
    # Fernet ciphertext of the normalized address; NULL after erasure (the hash stays).
    address_encrypted: Mapped[str | None] = mapped_column(Text)
    scope: Mapped[str] = mapped_column(String(128), default="all")
    reason: Mapped[str] = mapped_column(String(32))
    source_type: Mapped[str] = mapped_column(String(32))
    source_id: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class SuppressionHistory(Base):
    """Append-only log of every add and remove; never updated or deleted."""

    __tablename__ = "suppression_history"
    __table_args__ = (
        Index("ix_suppression_history_address", "channel", "address_hash"),
        Index("ix_suppression_history_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    suppression_id: Mapped[uuid.UUID | None] = mapped_column()
    channel: Mapped[str] = mapped_column(String(16))
    address_hash: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(Text)
    source_type: Mapped[str | None] = mapped_column(String(32))
    source_id: Mapped[str | None] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
