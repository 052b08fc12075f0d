"""Backoff policy: exponential with full jitter, bounded by attempts and by the deadline.

Pure code, no I/O: the random source and the clock are arguments.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar, cast

from retry.settings import PolicyOverride, RetrySettings

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Parameters of one backoff schedule."""

    base_seconds: float
    max_seconds: float
    max_attempts: int


def ceiling_seconds(backoff: Backoff, attempts_made: int) -> float:
    """The upper end of the jitter range after `attempts_made` attempts: min(cap, base*2^(n-1))."""
    # Bounded exponent: float(2**1023) is finite and a product that overflows becomes inf,
    # which min() turns into the cap, so any attempt count is safe.
    exponent = min(max(attempts_made - 1, 0), 1023)
    return min(backoff.max_seconds, backoff.base_seconds * 2.0**exponent)


def delay_seconds(
    backoff: Backoff,
    attempts_made: int,
    *,
    rng: random.Random | None = None,
    retry_after: float | None = None,
) -> float:
    """Full jitter: uniform in [0, min(cap, base * 2**(n-1))], with Retry-After as a floor.

    The floor wins over the cap: a provider that says when to come back is believed.
    """
    delay = (rng or random).uniform(0.0, ceiling_seconds(backoff, attempts_made))
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


def backoff_for(
    defaults: Backoff, overrides: Mapping[str, PolicyOverride], channel: str, priority: str
) -> Backoff:
    """The backoff for a delivery: each value from the most specific override that sets it.

    Selectors, most specific first: `<channel>.<priority>`, `<channel>`, `<priority>`; then the
    defaults (GATEWAY_RETRY_BASE_SECONDS / _MAX_SECONDS / _MAX_ATTEMPTS).
    """
    chain = [
        overrides.get(f"{channel}.{priority}"),
        overrides.get(channel),
        overrides.get(priority),
    ]
    found = [o for o in chain if o is not None]

    def pick(name: str, default: T) -> T:
        for override in found:
            value = getattr(override, name)
            if value is not None:
                return cast(T, value)
        return default

    return Backoff(
        base_seconds=pick("base_seconds", defaults.base_seconds),
        max_seconds=pick("max_seconds", defaults.max_seconds),
        max_attempts=pick("max_attempts", defaults.max_attempts),
    )


def backoff_from_settings(settings: RetrySettings, channel: str, priority: str) -> Backoff:
    """`backoff_for` with the defaults and overrides of the retry settings."""
    defaults = Backoff(settings.base_seconds, settings.max_seconds, settings.max_attempts)
    return backoff_for(defaults, settings.policies, channel, priority)
