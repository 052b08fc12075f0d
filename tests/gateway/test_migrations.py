"""The schema changes only through Alembic: head matches the models, and downgrade works."""

from __future__ import annotations

from collections.abc import Callable

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

import gateway.models  # noqa: F401  (register every table on the metadata)
import retry.models  # noqa: F401
import sender.models  # noqa: F401
import suppression.models  # noqa: F401
import webhooks.models
import webhooks.outbound.models  # noqa: F401
from gateway import migrate
from suppression.db import Base

EXPECTED_TABLES = {
    "messages",
    "deliveries",
    "attempts",
    "provider_events",
    "suppressions",
    "suppression_history",
    "dead_letters",
    "api_keys",
    "events",
    "webhook_endpoints",
    "webhook_deliveries",
    "webhook_attempts",
}


def _sync(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def test_upgrade_head_matches_models_and_downgrade_to_base(
    create_database: Callable[[], str],
) -> None:
    url = create_database()
    migrate.upgrade(url)
    engine = create_engine(_sync(url))
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert EXPECTED_TABLES <= tables
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            diff = compare_metadata(context, Base.metadata)
            assert diff == [], f"models and migrations differ: {diff}"
        assert migrate.current(url).startswith(_head())
        migrate.downgrade(url, "base")
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) <= {"alembic_version"}
        # and back up again, so downgrade left nothing behind that blocks a new upgrade
        migrate.upgrade(url)
    finally:
        engine.dispose()


def _head() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config("postgresql://unused/none"))
    head = script.get_current_head()
    assert head is not None
    return head


def test_constraints_exist(database_url: str) -> None:
    engine = create_engine(_sync(database_url))
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            uniques = {
                t: {tuple(u["column_names"]) for u in insp.get_unique_constraints(t)}
                | {tuple(i["column_names"]) for i in insp.get_indexes(t) if i["unique"]}
                for t in EXPECTED_TABLES
            }
            assert ("client_id", "idempotency_key") in uniques["messages"]
            assert ("derived_key",) in uniques["deliveries"]
            assert ("provider_message_id",) in uniques["deliveries"]
            assert ("provider", "provider_event_id") in uniques["provider_events"]
            assert ("channel", "address_hash", "scope") in uniques["suppressions"]
            partial = {i["name"]: i for i in insp.get_indexes("attempts")}
            assert partial["uq_attempts_one_in_progress"]["unique"]
            assert (
                "in_progress"
                in partial["uq_attempts_one_in_progress"]["dialect_options"]["postgresql_where"]
            )
            due = {i["name"]: i for i in insp.get_indexes("deliveries")}["ix_deliveries_due"]
            assert "next_attempt_at IS NOT NULL" in due["dialect_options"]["postgresql_where"]
    finally:
        engine.dispose()
