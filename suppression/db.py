"""Persistence base shared by every package's tables.

`suppression` is the lowest layer of the gateway (it depends on no other package), so the
declarative base and the naming convention that all tables use live here; every other package
imports them from here and defines its own tables next to its own code.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of every table; one MetaData for the whole schema."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def utcnow() -> dt.datetime:
    """The current time, timezone-aware in UTC (all timestamps are stored as timestamptz)."""
    return dt.datetime.now(dt.UTC)


def new_id() -> uuid.UUID:
    """A new random primary key."""
    return uuid.uuid4()
