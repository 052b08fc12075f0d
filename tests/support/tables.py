"""The delivery log's tables for tests that set up or inspect rows directly.

The packages reach these tables only through `sender.log`; tests may look at them as they
are (SQLAlchemy Core tables of the ORM models).
"""

from __future__ import annotations

from sender.models import Attempt, Delivery, Message

deliveries = Delivery.__table__
attempts = Attempt.__table__
messages = Message.__table__

__all__ = ["attempts", "deliveries", "messages"]
