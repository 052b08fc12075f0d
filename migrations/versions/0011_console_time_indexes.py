"""BRIN indexes on deliveries.created_at and attempts.started_at (the console's time windows)

Revision ID: 0011
Revises: 0009
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_deliveries_created_brin",
        "deliveries",
        ["created_at"],
        unique=False,
        postgresql_using="brin",
    )
    op.create_index(
        "ix_attempts_started_brin",
        "attempts",
        ["started_at"],
        unique=False,
        postgresql_using="brin",
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_started_brin", table_name="attempts", postgresql_using="brin")
    op.drop_index("ix_deliveries_created_brin", table_name="deliveries", postgresql_using="brin")
