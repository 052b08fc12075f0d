"""sandbox_messages: the sandbox mailbox and its simulated callbacks (they survive a restart)

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sandbox_messages",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("provider_message_id", sa.Text(), nullable=False),
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("to_hash", sa.String(length=64), nullable=False),
        sa.Column("content_encrypted", sa.Text(), nullable=True),
        sa.Column("callbacks", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("results", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("next_callback_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandbox_messages")),
    )
    op.create_index(
        "ix_sandbox_messages_created", "sandbox_messages", ["created_at", "id"], unique=False
    )
    op.create_index(
        "ix_sandbox_messages_to",
        "sandbox_messages",
        ["channel", "to_hash", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_sandbox_messages_pending",
        "sandbox_messages",
        ["next_callback_at"],
        unique=False,
        postgresql_where=sa.text("next_callback_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_sandbox_messages_pending",
        table_name="sandbox_messages",
        postgresql_where=sa.text("next_callback_at IS NOT NULL"),
    )
    op.drop_index("ix_sandbox_messages_to", table_name="sandbox_messages")
    op.drop_index("ix_sandbox_messages_created", table_name="sandbox_messages")
    op.drop_table("sandbox_messages")
