"""events: the transactional outbox (written by triggers) and message search indexes

Revision ID: 0009
Revises: 0004

The triggers write one `events` row per change of a delivery's status to a reported status
and per suppression add/remove, inside the transaction that makes the change: whatever code
path changes a row, its event commits or rolls back with it. See sender/events.py.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The delivery statuses that are reported as `delivery.<status>` (sender.events.DELIVERY_TYPES).
_REPORTED = (
    "'sent', 'delayed', 'delivered', 'read', 'bounced', 'complained', 'failed', "
    "'suppressed', 'retrying', 'dead'"
)

_FUNCTIONS = (
    """
CREATE FUNCTION events_on_delivery() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (xid, type, occurred_at, message_owner, message_id, delivery_id,
        channel, address_hash, address_encrypted, data)
    SELECT pg_current_xact_id()::text::bigint, 'delivery.' || NEW.status,
        statement_timestamp(), m.client_id, NEW.message_id, NEW.id, NEW.channel,
        NEW.recipient_hash, NEW.recipient_encrypted,
        jsonb_build_object(
            'status', NEW.status,
            'previous_status', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
            'reason', NEW.reason,
            'provider', NEW.provider,
            'provider_message_id', NEW.provider_message_id,
            'category', NEW.category,
            'topic', NEW.topic)
    FROM (SELECT NULL) AS one
    LEFT JOIN messages m ON m.id = NEW.message_id;
    RETURN NULL;
END
$$
""",
    """
CREATE FUNCTION events_on_suppression_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO events (xid, type, occurred_at, message_owner, channel, address_hash,
        address_encrypted, data)
    VALUES (pg_current_xact_id()::text::bigint, 'suppression.added', statement_timestamp(),
        NULL, NEW.channel, NEW.address_hash,
        (SELECT s.address_encrypted FROM suppressions s WHERE s.id = NEW.suppression_id),
        jsonb_build_object('scope', NEW.scope, 'reason', NEW.reason,
            'source', NEW.source_type));
    RETURN NULL;
END
$$
""",
    """
CREATE FUNCTION events_on_suppression_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- AFTER triggers fire once the whole statement is done, so the history row that the
    -- same statement wrote for this removal is visible here and says who removed it.
    INSERT INTO events (xid, type, occurred_at, message_owner, channel, address_hash,
        address_encrypted, data)
    VALUES (pg_current_xact_id()::text::bigint, 'suppression.removed', statement_timestamp(),
        NULL, OLD.channel, OLD.address_hash, OLD.address_encrypted,
        jsonb_build_object('scope', OLD.scope, 'reason', OLD.reason,
            'source', (SELECT h.source_type FROM suppression_history h
                       WHERE h.channel = OLD.channel AND h.address_hash = OLD.address_hash
                         AND h.suppression_id = OLD.id AND h.action = 'remove'
                       ORDER BY h.id DESC LIMIT 1)));
    RETURN NULL;
END
$$
""",
)

_TRIGGERS = (
    f"""
CREATE TRIGGER events_delivery_inserted AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.status IN ({_REPORTED}))
    EXECUTE FUNCTION events_on_delivery()""",
    f"""CREATE TRIGGER events_delivery_status AFTER UPDATE OF status ON deliveries
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status AND NEW.status IN ({_REPORTED}))
    EXECUTE FUNCTION events_on_delivery()""",
    """CREATE TRIGGER events_suppression_added AFTER INSERT ON suppression_history
    FOR EACH ROW WHEN (NEW.action = 'add')
    EXECUTE FUNCTION events_on_suppression_added()""",
    """CREATE TRIGGER events_suppression_removed AFTER DELETE ON suppressions
    FOR EACH ROW EXECUTE FUNCTION events_on_suppression_removed()""",
)


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("xid", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("message_owner", sa.Uuid(), nullable=True),
        sa.Column("message_id", sa.Uuid(), nullable=True),
        sa.Column("delivery_id", sa.Uuid(), nullable=True),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("address_hash", sa.String(length=64), nullable=False),
        sa.Column("address_encrypted", sa.Text(), nullable=True),
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_feed", "events", ["xid", "id"], unique=False)
    op.create_index("ix_events_occurred_at", "events", ["occurred_at"], unique=False)
    op.create_index("ix_events_address", "events", ["channel", "address_hash"], unique=False)
    op.create_index("ix_events_delivery", "events", ["delivery_id"], unique=False)
    op.create_index(
        "ix_messages_client_created", "messages", ["client_id", "created_at", "id"], unique=False
    )
    op.create_index("ix_messages_created", "messages", ["created_at", "id"], unique=False)
    for statement in (*_FUNCTIONS, *_TRIGGERS):
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS events_suppression_removed ON suppressions")
    op.execute("DROP TRIGGER IF EXISTS events_suppression_added ON suppression_history")
    op.execute("DROP TRIGGER IF EXISTS events_delivery_status ON deliveries")
    op.execute("DROP TRIGGER IF EXISTS events_delivery_inserted ON deliveries")
    op.execute("DROP FUNCTION IF EXISTS events_on_suppression_removed()")
    op.execute("DROP FUNCTION IF EXISTS events_on_suppression_added()")
    op.execute("DROP FUNCTION IF EXISTS events_on_delivery()")
    op.drop_index("ix_messages_created", table_name="messages")
    op.drop_index("ix_messages_client_created", table_name="messages")
    op.drop_index("ix_events_delivery", table_name="events")
    op.drop_index("ix_events_address", table_name="events")
    op.drop_index("ix_events_occurred_at", table_name="events")
    op.drop_index("ix_events_feed", table_name="events")
    op.drop_table("events")
