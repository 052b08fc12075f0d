"""Backoff policy: exponential with full jitter, bounded by attempts and by the deadline.

Pure code, no I/O: the random source and the clock are arguments.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
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


# -- the one retry decision ------------------------------------------------------------------


class Failure(StrEnum):
    """Why an attempt did not end the delivery, as far as retrying is concerned."""

    # The provider refused for now (throttled, 5xx, soft bounce): back off and try again.
    TRANSIENT = "transient"
    # Not the recipient's fault (paused account, unverified sender): wait out the breaker's
    # account cool-down; not held to the attempt budget, only to the deadline and the
    # maximum deferral age (`settle_reason`).
    ACCOUNT = "account"
    # The provider refused this one recipient for now (not reachable from this sender):
    # back off within the attempt budget and the deadline; then the delivery has failed
    # (that recipient's outcome, not a dead letter for an operator).
    RECIPIENT = "recipient"
    # The request went out and no answer came back: wait the settle window for a callback.
    UNKNOWN = "unknown"


class Action(StrEnum):
    """What happens to the delivery next."""

    RETRY = "retry"
    PAUSE = "pause"
    SETTLE = "settle"
    DEAD = "dead"
    FAIL = "fail"


@dataclass(frozen=True)
class Decision:
    """The outcome of `decide`: the action, when the delivery is due again, and for `dead`
    (and `fail`) why it ends (`max_attempts` or `expired`)."""

    action: Action
    at: dt.datetime | None = None
    dead_reason: str | None = None


def decide(
    failure: Failure,
    *,
    backoff: Backoff,
    attempts_made: int,
    now: dt.datetime,
    expires_at: dt.datetime | None,
    settings: RetrySettings,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> Decision:
    """Retry, pause, settle or give up after a failed attempt: the single place that decides.

    Used by the send path (after a provider call), the feedback path (a transient final
    callback; it passes the feedback backoff and its base as `retry_after`) and, through
    `settle_reason`, by the worker before it sends again.
    """
    if failure is Failure.UNKNOWN:
        return Decision(Action.SETTLE, now + dt.timedelta(seconds=settings.unknown_settle_seconds))
    if failure is Failure.ACCOUNT:
        delay = max(
            settings.defer_seconds,
            settings.breaker_account_cooldown_seconds,
            delay_seconds(backoff, attempts_made, rng=rng, retry_after=retry_after),
        )
        return Decision(Action.PAUSE, now + dt.timedelta(seconds=delay))
    at = next_attempt_at(
        backoff, attempts_made, now, expires_at=expires_at, rng=rng, retry_after=retry_after
    )
    if at is None:
        reason = "max_attempts" if attempts_made >= backoff.max_attempts else "expired"
        if failure is Failure.RECIPIENT:
            return Decision(Action.FAIL, dead_reason=reason)
        return Decision(Action.DEAD, dead_reason=reason)
    return Decision(Action.RETRY, at)


def settle_reason(
    *,
    backoff: Backoff,
    attempts_made: int,
    now: dt.datetime,
    expires_at: dt.datetime | None,
    settings: RetrySettings,
    outcome_unknown: bool,
    transactional: bool,
    held_to_budget: bool,
    deferred_since: dt.datetime | None = None,
) -> str | None:
    """The dead-letter reason when a due delivery must not be sent again, else None.

    `outcome_unknown`: its last attempt's outcome stayed unknown through the settle window
    (a second marketing message is billed and annoys, so by default it is not resent);
    `held_to_budget`: False for deliveries waiting for their first call or deferred without
    an attempt (rate limit, open circuit, account pause), which are bounded instead by the
    deadline and by the maximum deferral age: `deferred_since` is when the delivery began
    waiting without a provider answer about it, and after `max_deferral_seconds` of that it
    is dead-lettered `max_deferral` (so nothing waits for ever without a deadline).
    """
    if expires_at is not None and expires_at <= now:
        return "expired"
    if (
        not held_to_budget
        and deferred_since is not None
        and (now - deferred_since).total_seconds() >= settings.max_deferral_seconds
    ):
        return "max_deferral"
    if (
        outcome_unknown
        and not transactional
        and settings.unknown_outcome_marketing == "dead_letter"
    ):
        return "unknown_outcome"
    if held_to_budget and attempts_made >= backoff.max_attempts:
        return "max_attempts"
    return None
