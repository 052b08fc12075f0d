"""Alembic, driven programmatically (no alembic.ini): upgrade, downgrade, current."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from alembic import command
from alembic.config import Config

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str, stdout: TextIO | None = None) -> Config:
    """An Alembic config pointing at our migrations and at `database_url`."""
    cfg = Config(stdout=stdout) if stdout is not None else Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision`."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    """Revert migrations down to `revision`."""
    command.downgrade(alembic_config(database_url), revision)


def current(database_url: str) -> str:
    """The revision the database is at, as Alembic prints it."""
    out = io.StringIO()
    command.current(alembic_config(database_url, stdout=out))
    return out.getvalue().strip()
