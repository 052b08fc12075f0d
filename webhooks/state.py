"""The advance-only state machine of provider feedback (pure code, no I/O).

Each provider state has a rank per channel (DESIGN.md "Advance only"); an event applies only
if it moves the attempt to a strictly higher rank. Ranks are totally ordered here (states
sharing a DESIGN rank get a fixed tie-break), so the final state of any permutation, with
any duplicates, of a set of events is their maximum: the same as in canonical order.

=======  ==========================  ========================================
rank     email (SES)                 SMS (Twilio)
=======  ==========================  ========================================
0        gateway states: queued, sending, unknown, retrying, dead (and no
         callback yet)
1        sent (Send)                 sent (queued, accepted, sending, sent)
2        delayed (DeliveryDelay)     -
3        delivered (Delivery)        delivered
4.0      transient (soft bounce)     transient (undelivered/failed, retryable)
4.1      failed (Reject, Rendering)  failed (undelivered/failed, permanent)
4.2      bounced (hard bounce)       read
5        complained                  -
=======  ==========================  ========================================

``transient`` is a provider state of one attempt (the provider gave up on that message but
another attempt may succeed); the delivery then shows ``retrying`` (or ``dead`` when the
retry budget is spent). ``suppressed`` and ``cancelled`` never move. Engagement events
(open, click) have no state and never move anything.

Ranks apply per attempt. The delivery shows the state of its latest attempt; a callback for
an older attempt only advances that attempt, except that a positive outcome (sent and up,
not a failure) moves a delivery the gateway was still working on or had given up on
(`unknown`, `retrying`, `dead`) forward: the provider's word is the truth about what it did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sender.status import (
    BOUNCED,
    COMPLAINED,
    DEAD,
    DELAYED,
    DELIVERED,
    FAILED,
    GATEWAY_STATES,
    NEVER_SENT,
    READ,
    RETRYING,
    SENDING,
    SENT,
)

EMAIL = "email"
SMS = "sms"
TRANSIENT = "transient"

_RANKS: dict[str, dict[str, tuple[int, int]]] = {
    EMAIL: {
        SENT: (1, 0),
        DELAYED: (2, 0),
        DELIVERED: (3, 0),
        TRANSIENT: (4, 0),
        FAILED: (4, 1),
        BOUNCED: (4, 2),
        COMPLAINED: (5, 0),
    },
    SMS: {
        SENT: (1, 0),
        DELIVERED: (3, 0),
        TRANSIENT: (4, 0),
        FAILED: (4, 1),
        READ: (4, 2),
    },
}
BOTTOM = (0, 0)

# Provider states that say the message went out (or further); they may revive a delivery
# the gateway had given up on.
POSITIVE = frozenset({SENT, DELAYED, DELIVERED, READ})

APPLIED = "applied"
DUPLICATE = "duplicate"
REGRESSION = "regression"
IGNORED = "ignored"
PARKED = "parked"
DISPOSITIONS = (APPLIED, DUPLICATE, REGRESSION, PARKED, IGNORED)


def states(channel: str) -> tuple[str, ...]:
    """The provider states of `channel`, lowest rank first."""
    table = _RANKS[channel]
    return tuple(sorted(table, key=table.__getitem__))


def rank(channel: str, state: str | None) -> tuple[int, int]:
    """The rank of a provider state; gateway states, None and anything that is not a
    provider state of `channel` are below every provider state."""
    if state is None or state in GATEWAY_STATES:
        return BOTTOM
    return _RANKS[channel].get(state, BOTTOM)


def provider_state(channel: str, status: str | None) -> str | None:
    """`status` if it is a provider state of `channel`, else None (gateway states etc.)."""
    return status if status in _RANKS[channel] else None


@dataclass(frozen=True)
class Step:
    """What one event does to an attempt and its delivery.

    `delivery_status` is None when the delivery does not change. For a `transient` attempt
    state it is ``retrying`` or ``dead`` (by the caller's `can_retry`): the caller then
    schedules the retry or files the dead letter. `cancel_retry` says a pending retry must be
    taken off the queue.
    """

    disposition: str
    attempt_state: str | None
    delivery_status: str | None
    cancel_retry: bool = False


def step(
    channel: str,
    *,
    attempt_state: str | None,
    delivery_status: str,
    new_state: str | None,
    latest: bool = True,
    can_retry: bool = True,
) -> Step:
    """Apply one event's provider state (None = engagement/record only) to an attempt.

    `latest` says the attempt is the delivery's latest one; `can_retry` whether the retry
    budget and deadline allow another attempt (only used for a `transient` state).
    """
    if new_state is None:
        return Step(IGNORED, attempt_state, None)
    if new_state not in _RANKS[channel]:
        raise ValueError(f"{new_state!r} is not a provider state of {channel}")
    new_rank = rank(channel, new_state)
    old_rank = rank(channel, attempt_state)
    if new_rank == old_rank:
        return Step(DUPLICATE, attempt_state, None)
    if new_rank < old_rank:
        return Step(REGRESSION, attempt_state, None)
    if delivery_status in NEVER_SENT:
        # Suppressed or cancelled: the delivery was never handed to the provider by us, so
        # a callback (for an older attempt) is recorded on that attempt only.
        return Step(APPLIED, new_state, None)
    if latest:
        if new_state == TRANSIENT:
            shown = RETRYING if can_retry else DEAD
        else:
            shown = new_state
        if shown == delivery_status:
            return Step(APPLIED, new_state, None)
        return Step(APPLIED, new_state, shown, cancel_retry=new_state != TRANSIENT)
    if new_state in POSITIVE and delivery_status in GATEWAY_STATES - {SENDING}:
        return Step(APPLIED, new_state, new_state, cancel_retry=True)
    return Step(APPLIED, new_state, None)


def replay(
    channel: str,
    delivery_status: str,
    new_states: Iterable[str | None],
    *,
    can_retry: bool = True,
) -> tuple[str | None, str]:
    """Fold a sequence of event states over one (latest) attempt of a delivery.

    Returns (attempt state, delivery status). The property tests use it to show that order
    and duplicates do not matter; the ingestor applies `step` one event at a time.
    """
    attempt: str | None = None
    status = delivery_status
    for new_state in new_states:
        result = step(
            channel,
            attempt_state=attempt,
            delivery_status=status,
            new_state=new_state,
            can_retry=can_retry,
        )
        attempt = result.attempt_state
        if result.delivery_status is not None:
            status = result.delivery_status
    return attempt, status
