"""Backoff policy: exponential with full jitter, bounded by attempts and by the deadline.

Pure code, no I/O: the random source and the clock are arguments.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Parameters of one backoff schedule."""

    base_seconds: float
    max_seconds: float
    max_attempts: int


def delay_seconds(
    backoff: Backoff,
    attempts_made: int,
    *,
    rng: random.Random | None = None,
    retry_after: float | None = None,
) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(n-1))], with Retry-After as a floor."""
    ceiling = min(backoff.max_seconds, backoff.base_seconds * (2 ** max(attempts_made - 1, 0)))
    delay = (rng or random).uniform(0.0, ceiling)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


def next_attempt_at(
    backoff: Backoff,
    attempts_made: int,
    now: dt.datetime,
    *,
    expires_at: dt.datetime | None = None,
    rng: random.Random | None = None,
    retry_after: float | None = None,
) -> dt.datetime | None:
    """When to try again after `attempts_made` attempts; None when the budget or time is out."""
    if attempts_made >= backoff.max_attempts:
        return None
    at = now + dt.timedelta(
        seconds=delay_seconds(backoff, attempts_made, rng=rng, retry_after=retry_after)
    )
    if expires_at is not None and at >= expires_at:
        return None
    return at
