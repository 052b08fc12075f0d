"""campaigns: bulk sends (campaigns, campaign_recipients; deliveries.position as integer)

Revision ID: 0005
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# The delivery statuses reported as outbound events (sender.events.DELIVERY_STATUSES): 0009's
# list and `cancelled`, new here.
_REPORTED_BEFORE = (
    "'sent', 'delayed', 'delivered', 'read', 'bounced', 'complained', 'failed', "
    "'suppressed', 'retrying', 'dead'"
)
_REPORTED = _REPORTED_BEFORE + ", 'cancelled'"


def _delivery_triggers(reported: str) -> None:
    op.execute("DROP TRIGGER IF EXISTS events_delivery_status ON deliveries")
    op.execute("DROP TRIGGER IF EXISTS events_delivery_inserted ON deliveries")
    op.execute(
        f"""CREATE TRIGGER events_delivery_inserted AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.status IN ({reported}))
    EXECUTE FUNCTION events_on_delivery()"""
    )
    op.execute(
        f"""CREATE TRIGGER events_delivery_status AFTER UPDATE OF status ON deliveries
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ({reported}))
    EXECUTE FUNCTION events_on_delivery()"""
    )


def upgrade() -> None:
    # `cancelled` deliveries (a cancelled campaign) are reported as `delivery.cancelled`.
    _delivery_triggers(_REPORTED)
    # A campaign delivery's position is its recipient's index in a list of up to 1,000,000.
    op.alter_column(
        "deliveries",
        "position",
        existing_type=sa.SmallInteger(),
        type_=sa.Integer(),
        existing_nullable=False,
    )
    op.create_table(
        "campaigns",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("client_id", sa.Uuid(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("read_count", sa.Integer(), nullable=False),
        sa.Column("invalid_count", sa.Integer(), nullable=False),
        sa.Column("duplicate_count", sa.Integer(), nullable=False),
        sa.Column("expanded_position", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_campaigns_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaigns")),
        sa.UniqueConstraint(
            "client_id", "idempotency_key", name="uq_campaigns_client_idempotency_key"
        ),
        sa.UniqueConstraint("message_id", name=op.f("uq_campaigns_message_id")),
    )
    op.create_index("ix_campaigns_created", "campaigns", ["created_at", "id"], unique=False)
    op.create_index(
        "ix_campaigns_client_created",
        "campaigns",
        ["client_id", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        "ix_campaigns_active",
        "campaigns",
        ["state"],
        unique=False,
        postgresql_where=sa.text("state IN ('expanding', 'sending')"),
    )
    op.create_table(
        "campaign_recipients",
        sa.Column("campaign_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("recipient_hash", sa.String(length=64), nullable=False),
        sa.Column("recipient_encrypted", sa.Text(), nullable=True),
        sa.Column("derived_key", sa.String(length=64), nullable=False),
        sa.Column("metadata", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["campaign_id"],
            ["campaigns.id"],
            name=op.f("fk_campaign_recipients_campaign_id_campaigns"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("campaign_id", "position", name=op.f("pk_campaign_recipients")),
        sa.UniqueConstraint(
            "campaign_id", "recipient_hash", name="uq_campaign_recipients_campaign_id"
        ),
    )


def downgrade() -> None:
    _delivery_triggers(_REPORTED_BEFORE)
    op.drop_table("campaign_recipients")
    op.drop_index(
        "ix_campaigns_active",
        table_name="campaigns",
        postgresql_where=sa.text("state IN ('expanding', 'sending')"),
    )
    op.drop_index("ix_campaigns_client_created", table_name="campaigns")
    op.drop_index("ix_campaigns_created", table_name="campaigns")
    op.drop_table("campaigns")
    op.alter_column(
        "deliveries",
        "position",
        existing_type=sa.Integer(),
        type_=sa.SmallInteger(),
        existing_nullable=False,
    )
