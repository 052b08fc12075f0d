"""Delivery status strings, exact and shared by the whole API (pure constants, no I/O).

The gateway's own states (`queued`, `sending`, `unknown`, `retrying`, `dead`) say where a
delivery is in our pipeline; the provider states (`sent` .. `complained`, `failed`) say what
the provider told us; `suppressed` means the provider was never called, and so does
`cancelled` (a campaign delivery still `queued` when its campaign was cancelled).
"""

from __future__ import annotations

from enum import StrEnum


class DeliveryStatus(StrEnum):
    """Every value of `deliveries.status`."""

    QUEUED = "queued"
    SENDING = "sending"
    UNKNOWN = "unknown"
    RETRYING = "retrying"
    SENT = "sent"
    DELAYED = "delayed"
    DELIVERED = "delivered"
    READ = "read"
    BOUNCED = "bounced"
    COMPLAINED = "complained"
    FAILED = "failed"
    SUPPRESSED = "suppressed"
    DEAD = "dead"
    CANCELLED = "cancelled"


QUEUED = DeliveryStatus.QUEUED.value
SENDING = DeliveryStatus.SENDING.value
UNKNOWN = DeliveryStatus.UNKNOWN.value
RETRYING = DeliveryStatus.RETRYING.value
SENT = DeliveryStatus.SENT.value
DELAYED = DeliveryStatus.DELAYED.value
DELIVERED = DeliveryStatus.DELIVERED.value
READ = DeliveryStatus.READ.value
BOUNCED = DeliveryStatus.BOUNCED.value
COMPLAINED = DeliveryStatus.COMPLAINED.value
FAILED = DeliveryStatus.FAILED.value
SUPPRESSED = DeliveryStatus.SUPPRESSED.value
DEAD = DeliveryStatus.DEAD.value
CANCELLED = DeliveryStatus.CANCELLED.value

ALL: tuple[str, ...] = tuple(s.value for s in DeliveryStatus)

# States owned by the gateway (below provider rank 1: a provider callback may move them on).
GATEWAY_STATES: frozenset[str] = frozenset({QUEUED, SENDING, UNKNOWN, RETRYING, DEAD})

# Waiting for another attempt or for a settle window: the send answer was "deferred" (202).
DEFERRED: frozenset[str] = frozenset({QUEUED, SENDING, UNKNOWN, RETRYING})

# Final without a provider call: no provider callback moves a delivery out of these.
NEVER_SENT: frozenset[str] = frozenset({SUPPRESSED, CANCELLED})

# A delivery in one of these may be handed to the provider by `dispatch`.
DISPATCHABLE: frozenset[str] = frozenset({QUEUED, RETRYING, UNKNOWN})


class AttemptStatus(StrEnum):
    """Every value of `attempts.status` (one provider call each)."""

    IN_PROGRESS = "in_progress"
    ACCEPTED = "accepted"
    TRANSIENT = "transient"
    FAILED = "failed"
    UNKNOWN = "unknown"
    DEFERRED = "deferred"


PRIORITY_RANK: dict[str, int] = {"high": 2, "normal": 1, "low": 0}
RANK_PRIORITY: dict[int, str] = {rank: name for name, rank in PRIORITY_RANK.items()}
