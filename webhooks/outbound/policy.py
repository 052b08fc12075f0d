"""The push side's decisions, as pure functions: when to try again, when an endpoint has
failed long enough to be disabled, which events an endpoint receives, which secrets sign."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sender.events import EVENT_TYPES

__all__ = ["ALL_EVENTS", "EVENT_TYPES"]

ALL_EVENTS = "*"


def next_attempt_at(
    tries_made: int, schedule: Sequence[float], now: dt.datetime
) -> dt.datetime | None:
    """When to try again after `tries_made` tries that all failed (the first try is not in
    the schedule: `schedule[0]` is the wait after it), or None when the schedule is used up
    and the event is failed for the endpoint."""
    index = tries_made - 1
    if index < 0 or index >= len(schedule):
        return None
    return now + dt.timedelta(seconds=schedule[index])


def should_disable(failing_since: dt.datetime | None, now: dt.datetime, window: float) -> bool:
    """True when every try has failed since `failing_since` and that is at least `window`
    seconds ago."""
    return failing_since is not None and now - failing_since >= dt.timedelta(seconds=window)


def subscribed(events: Sequence[str], event_type: str) -> bool:
    """Whether an endpoint subscribed to `events` receives `event_type`."""
    return ALL_EVENTS in events or event_type in events


def signing_secrets(
    current: str, previous: str | None, previous_expires_at: dt.datetime | None, now: dt.datetime
) -> list[str]:
    """The secrets that sign a push at `now`: the current one, and the previous one while its
    overlap after a rotation lasts."""
    if previous is not None and previous_expires_at is not None and now < previous_expires_at:
        return [current, previous]
    return [current]
