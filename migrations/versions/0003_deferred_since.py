"""deliveries.deferred_since: when a delivery began waiting without a provider answer

Bounds deferrals that count no attempt (rate limit, open circuit, account-level pause) by
GATEWAY_RETRY_MAX_DEFERRAL_SECONDS as well as by the message deadline.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "deliveries",
        sa.Column("deferred_since", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("deliveries", "deferred_since")
