"""What the retry package needs of the delivery log, declared as protocols.

`retry` never imports `sender`: the delivery log (`sender.log`, the one owner of
`messages`/`deliveries`/`attempts`) implements `DeliveryQueue`, and the composition root
hands it to the worker, the sweeper and the dead-letter queue. Every operation takes an
asyncpg connection (`suppression.db.pg_connection`/`pg_of`) so callers choose the
transaction. Statuses stay the log's business: a claimed delivery tells the worker what it
needs as booleans, and `token` is an opaque value handed back when releasing it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from suppression.db import Pg


class Due(Protocol):
    """A delivery the worker claimed (taken off the queue)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def token(self) -> str: ...
    @property
    def due_at(self) -> dt.datetime: ...
    @property
    def priority_rank(self) -> int: ...
    @property
    def priority(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def transactional(self) -> bool: ...
    @property
    def expires_at(self) -> dt.datetime | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def outcome_unknown(self) -> bool: ...
    @property
    def held_to_budget(self) -> bool: ...
    @property
    def deferred_since(self) -> dt.datetime | None: ...


@runtime_checkable
class DeliveryQueue(Protocol):
    """The delivery log's operations that the retry package uses.

    Runtime-checkable: the API's dependency injection checks the value it is handed (the
    `sender.log` module) against this type.
    """

    async def claim_due(
        self, conn: Pg, *, limit: int, now: dt.datetime, min_rank: int = 0, max_rank: int = 2
    ) -> Sequence[Due]:
        """Take up to `limit` due deliveries whose priority rank lies in
        [`min_rank`, `max_rank`] off the queue (SKIP LOCKED), highest priority first."""
        ...

    async def release(self, conn: Pg, items: Sequence[Due]) -> None:
        """Put claimed, never-dispatched deliveries back exactly as they were."""
        ...

    async def requeue_undispatched(
        self, conn: Pg, item: Due, *, at: dt.datetime, error: str, now: dt.datetime
    ) -> None:
        """A claimed delivery whose dispatch failed before any attempt: due again at `at`."""
        ...

    async def sweep_stale(
        self, conn: Pg, *, cutoff: dt.datetime, now: dt.datetime, settle_at: dt.datetime
    ) -> tuple[int, int, int]:
        """Resolve stale in-progress attempts and abandoned claims; counts of each kind."""
        ...

    async def dead_letter(
        self,
        conn: Pg,
        delivery_id: uuid.UUID,
        *,
        reason: str,
        last_error: str | None,
        now: dt.datetime,
    ) -> uuid.UUID | None:
        """Mark the delivery dead and file its dead-letter entry."""
        ...

    async def statuses(self, conn: Pg, delivery_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
        """Current statuses of deliveries (for showing dead-letter entries)."""
        ...

    async def dead_ids(self, conn: Pg, delivery_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """Which of these deliveries are dead (and so may be redriven)."""
        ...

    async def requeue_dead(
        self, conn: Pg, delivery_ids: Sequence[uuid.UUID], *, now: dt.datetime
    ) -> list[uuid.UUID]:
        """Redrive dead deliveries: queued, due now, fresh attempt budget. Returns the ids
        requeued; a dead delivery whose deadline has passed is left dead."""
        ...


__all__ = ["DeliveryQueue", "Due"]
