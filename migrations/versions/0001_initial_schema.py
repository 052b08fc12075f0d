"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 20:08:48.157496
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", postgresql.ARRAY(sa.String(length=16)), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("secret_hash", name=op.f("uq_api_keys_secret_hash")),
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("client_id", sa.Uuid(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("topic", sa.String(length=128), nullable=True),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("content_encrypted", sa.Text(), nullable=True),
        sa.Column("metadata", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("response_code", sa.SmallInteger(), nullable=True),
        sa.Column("first_answers", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        sa.UniqueConstraint(
            "client_id", "idempotency_key", name="uq_messages_client_idempotency_key"
        ),
    )
    op.create_table(
        "suppression_history",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("suppression_id", sa.Uuid(), nullable=True),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("address_hash", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("source_type", sa.String(length=32), nullable=True),
        sa.Column("source_id", sa.Text(), nullable=True),
        sa.Column("details", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suppression_history")),
    )
    op.create_index(
        "ix_suppression_history_address",
        "suppression_history",
        ["channel", "address_hash"],
        unique=False,
    )
    op.create_index("ix_suppression_history_at", "suppression_history", ["at"], unique=False)
    op.create_table(
        "suppressions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("address_hash", sa.String(length=64), nullable=False),
        sa.Column("address_encrypted", sa.Text(), nullable=True),
        sa.Column("scope", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("source_type", sa.String(length=32), nullable=False),
        sa.Column("source_id", sa.Text(), nullable=True),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_suppressions")),
        sa.UniqueConstraint(
            "channel", "address_hash", "scope", name="uq_suppressions_address_scope"
        ),
    )
    op.create_index("ix_suppressions_created_at", "suppressions", ["created_at"], unique=False)
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.SmallInteger(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("recipient_hash", sa.String(length=64), nullable=False),
        sa.Column("recipient_encrypted", sa.Text(), nullable=True),
        sa.Column("derived_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("provider", sa.String(length=32), nullable=True),
        sa.Column("provider_message_id", sa.Text(), nullable=True),
        sa.Column("category", sa.String(length=16), nullable=False),
        sa.Column("topic", sa.String(length=128), nullable=True),
        sa.Column("priority_rank", sa.SmallInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("suppression_id", sa.Uuid(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_deliveries_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deliveries")),
        sa.UniqueConstraint("derived_key", name=op.f("uq_deliveries_derived_key")),
        sa.UniqueConstraint("provider_message_id", name=op.f("uq_deliveries_provider_message_id")),
    )
    op.create_index(
        "ix_deliveries_due",
        "deliveries",
        [sa.literal_column("priority_rank DESC"), "next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("next_attempt_at IS NOT NULL"),
    )
    op.create_index(op.f("ix_deliveries_message_id"), "deliveries", ["message_id"], unique=False)
    op.create_index(
        "ix_deliveries_recipient_hash", "deliveries", ["channel", "recipient_hash"], unique=False
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("provider_message_id", sa.Text(), nullable=True),
        sa.Column("provider_status", sa.String(length=16), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name=op.f("fk_attempts_delivery_id_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("delivery_id", "number", name="uq_attempts_delivery_number"),
        sa.UniqueConstraint("provider_message_id", name=op.f("uq_attempts_provider_message_id")),
    )
    op.create_index(op.f("ix_attempts_delivery_id"), "attempts", ["delivery_id"], unique=False)
    op.create_index(
        "ix_attempts_in_progress_started",
        "attempts",
        ["started_at"],
        unique=False,
        postgresql_where=sa.text("status = 'in_progress'"),
    )
    op.create_index(
        "uq_attempts_one_in_progress",
        "attempts",
        ["delivery_id"],
        unique=True,
        postgresql_where=sa.text("status = 'in_progress'"),
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("attempt_history", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolution", sa.String(length=16), nullable=True),
        sa.Column("resolution_reason", sa.Text(), nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name=op.f("fk_dead_letters_delivery_id_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
    )
    op.create_index(
        op.f("ix_dead_letters_delivery_id"), "dead_letters", ["delivery_id"], unique=False
    )
    op.create_index(
        "ix_dead_letters_open",
        "dead_letters",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.create_table(
        "provider_events",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("provider_event_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.String(length=32), nullable=False),
        sa.Column("provider_message_id", sa.Text(), nullable=True),
        sa.Column("delivery_id", sa.Uuid(), nullable=True),
        sa.Column("attempt_id", sa.Uuid(), nullable=True),
        sa.Column("recipient_hash", sa.String(length=64), nullable=True),
        sa.Column("disposition", sa.String(length=16), nullable=False),
        sa.Column("details", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_encrypted", sa.Text(), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["attempt_id"],
            ["attempts.id"],
            name=op.f("fk_provider_events_attempt_id_attempts"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["deliveries.id"],
            name=op.f("fk_provider_events_delivery_id_deliveries"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_events")),
        sa.UniqueConstraint(
            "provider", "provider_event_id", name="uq_provider_events_provider_event"
        ),
    )
    op.create_index(
        op.f("ix_provider_events_delivery_id"), "provider_events", ["delivery_id"], unique=False
    )
    op.create_index(
        "ix_provider_events_parked",
        "provider_events",
        ["provider_message_id"],
        unique=False,
        postgresql_where=sa.text("disposition = 'parked'"),
    )
    op.create_index(
        "ix_provider_events_recipient",
        "provider_events",
        ["recipient_hash", "received_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_provider_events_recipient", table_name="provider_events")
    op.drop_index(
        "ix_provider_events_parked",
        table_name="provider_events",
        postgresql_where=sa.text("disposition = 'parked'"),
    )
    op.drop_index(op.f("ix_provider_events_delivery_id"), table_name="provider_events")
    op.drop_table("provider_events")
    op.drop_index(
        "ix_dead_letters_open",
        table_name="dead_letters",
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.drop_index(op.f("ix_dead_letters_delivery_id"), table_name="dead_letters")
    op.drop_table("dead_letters")
    op.drop_index(
        "uq_attempts_one_in_progress",
        table_name="attempts",
        postgresql_where=sa.text("status = 'in_progress'"),
    )
    op.drop_index(
        "ix_attempts_in_progress_started",
        table_name="attempts",
        postgresql_where=sa.text("status = 'in_progress'"),
    )
    op.drop_index(op.f("ix_attempts_delivery_id"), table_name="attempts")
    op.drop_table("attempts")
    op.drop_index("ix_deliveries_recipient_hash", table_name="deliveries")
    op.drop_index(op.f("ix_deliveries_message_id"), table_name="deliveries")
    op.drop_index(
        "ix_deliveries_due",
        table_name="deliveries",
        postgresql_where=sa.text("next_attempt_at IS NOT NULL"),
    )
    op.drop_table("deliveries")
    op.drop_index("ix_suppressions_created_at", table_name="suppressions")
    op.drop_table("suppressions")
    op.drop_index("ix_suppression_history_at", table_name="suppression_history")
    op.drop_index("ix_suppression_history_address", table_name="suppression_history")
    op.drop_table("suppression_history")
    op.drop_table("messages")
    op.drop_table("api_keys")
