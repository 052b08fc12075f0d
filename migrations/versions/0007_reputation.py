"""reputation guard: deliveries.sender_identity, reputation_states, reputation_history

(The BRIN index on deliveries.created_at the guard's window uses comes from 0011.)

Revision ID: 0007
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("sender_identity", sa.String(length=255), nullable=True))
    op.create_table(
        "reputation_states",
        sa.Column("identity", sa.String(length=255), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sends", sa.Integer(), nullable=False),
        sa.Column("bounces", sa.Integer(), nullable=False),
        sa.Column("complaints", sa.Integer(), nullable=False),
        sa.Column("evaluated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("hold_level", sa.SmallInteger(), nullable=False),
        sa.Column("hold_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resumed_by", sa.Text(), nullable=True),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resume_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("identity", name=op.f("pk_reputation_states")),
    )
    op.create_table(
        "reputation_history",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("identity", sa.String(length=255), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("from_state", sa.String(length=24), nullable=True),
        sa.Column("to_state", sa.String(length=24), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reputation_history")),
    )
    op.create_index(
        "ix_reputation_history_identity_at",
        "reputation_history",
        ["identity", "at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_reputation_history_identity_at", table_name="reputation_history")
    op.drop_table("reputation_history")
    op.drop_table("reputation_states")
    op.drop_column("deliveries", "sender_identity")
