"""messages.request_id and attempts.request_id: the HTTP request an attempt was made for

The send request's id (X-Request-Id when sane, else generated) is stored on the message and
its first attempts; the retry worker's later attempts of the same delivery carry it too.

Revision ID: 0008
Revises: 0010
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("request_id", sa.String(length=128), nullable=True))
    op.add_column("attempts", sa.Column("request_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    op.drop_column("attempts", "request_id")
    op.drop_column("messages", "request_id")
