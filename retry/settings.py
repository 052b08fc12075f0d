"""The retry package's knobs: backoff, worker, rate limits, circuit breaker.

A plain dataclass that `gateway.settings` fills in from the environment (and re-exports as
`gateway.settings.RetrySettings`). The small parsers for the structured settings live here so
that the rules for their syntax sit next to the code that interprets them; they raise
`ValueError` with a message, which the settings loader turns into a `SettingsError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

CHANNELS = ("email", "sms")
PRIORITIES = ("high", "normal", "low")
UNKNOWN_OUTCOME_POLICIES = ("dead_letter", "retry")


@dataclass(frozen=True)
class PolicyOverride:
    """Backoff values for one selector (`sms.high`, `email`, `low`, ...); None = inherit."""

    base_seconds: float | None = None
    max_seconds: float | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class RateSpec:
    """A token bucket: `rate` tokens per second, at most `burst` tokens (None = derived)."""

    rate: float
    burst: float | None = None


def _default_rate_limits() -> dict[str, RateSpec]:
    # Each provider declares its own default buckets (`rate_limits` of its send spec, e.g.
    # SES 14/s, a Twilio long code 1/s); `gateway.settings` fills them in. Operators set
    # their real quotas; these only keep a fresh install within common limits.
    return {}


@dataclass(frozen=True)
class RetrySettings:
    """Retry, worker, rate-limit and breaker knobs (consumed by the `retry` package)."""

    base_seconds: float = 2.0
    max_seconds: float = 600.0
    max_attempts: int = 6
    feedback_base_seconds: float = 1800.0
    worker_enabled: bool = True
    worker_poll_seconds: float = 1.0
    worker_batch: int = 50
    unknown_settle_seconds: float = 300.0
    stale_in_progress_seconds: float = 120.0
    # Selector -> override; selectors: "<channel>.<priority>", "<channel>", "<priority>".
    policies: Mapping[str, PolicyOverride] = field(default_factory=dict)
    # How many claimed deliveries one worker dispatches at the same time.
    worker_concurrency: int = 10
    # What a non-transactional delivery whose outcome stayed unknown gets after the settle
    # window: "dead_letter" (default; a second marketing SMS is billed and annoys) or "retry".
    unknown_outcome_marketing: str = "dead_letter"
    # Bucket key ("ses", "twilio:<from or service sid>", "twilio:*" as the per-sender
    # default) -> rate. Keys without an entry are not limited. Defaults: the providers'.
    rate_limits: Mapping[str, RateSpec] = field(default_factory=_default_rate_limits)
    # Share of a bucket that low-priority sends may use; the rest is kept for high/normal.
    low_priority_share: float = 0.6
    # How far a send that found no token or an open breaker is pushed back (not an attempt).
    defer_seconds: float = 1.0
    # How long a delivery may wait without any provider answer about it (deferred by a rate
    # limit or an open circuit, paused by an account-level error) before it is dead-lettered
    # `max_deferral`; the message's deadline bounds it earlier when it has one.
    max_deferral_seconds: float = 86400.0
    breaker_failure_ratio: float = 0.5
    breaker_min_volume: int = 20
    breaker_window_seconds: float = 60.0
    breaker_cooldown_seconds: float = 30.0
    # Account-level errors (sending paused, suspended) need a human; probe less often.
    breaker_account_cooldown_seconds: float = 300.0


def parse_policies(raw: str) -> dict[str, PolicyOverride]:
    """Parse `sms.high=1/30/4,email.low=60//3` (base/cap/attempts; an empty part inherits)."""
    result: dict[str, PolicyOverride] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        selector, sep, values = item.partition("=")
        selector = selector.strip().lower()
        if not sep:
            raise ValueError(f"entry {item!r} must look like selector=base/cap/attempts")
        _check_selector(selector)
        parts = [p.strip() for p in values.split("/")]
        if len(parts) != 3:
            raise ValueError(f"entry {item!r} must have three parts base/cap/attempts")
        try:
            base = float(parts[0]) if parts[0] else None
            cap = float(parts[1]) if parts[1] else None
            attempts = int(parts[2]) if parts[2] else None
        except ValueError:
            raise ValueError(f"entry {item!r} has a value that is not a number") from None
        if (base is not None and not (base >= 0 and math.isfinite(base))) or (
            cap is not None and not (cap >= 0 and math.isfinite(cap))
        ):
            raise ValueError(f"entry {item!r}: seconds must be finite and >= 0")
        if attempts is not None and attempts < 1:
            raise ValueError(f"entry {item!r}: attempts must be >= 1")
        result[selector] = PolicyOverride(base, cap, attempts)
    return result


def _check_selector(selector: str) -> None:
    channel, dot, priority = selector.partition(".")
    if dot:
        if channel not in CHANNELS or priority not in PRIORITIES:
            raise ValueError(f"selector {selector!r} must be <channel>.<priority>")
    elif selector not in CHANNELS and selector not in PRIORITIES:
        raise ValueError(
            f"selector {selector!r} must be one of {', '.join(CHANNELS + PRIORITIES)} "
            "or <channel>.<priority>"
        )


def parse_rate_limits(raw: str) -> dict[str, RateSpec]:
    """Parse `ses=14,twilio:*=1,twilio:+15551234567=1/3` (per second, optional /burst)."""
    result: dict[str, RateSpec] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        # Keys may contain ':' and '+', never '='.
        key, sep, value = item.rpartition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"entry {item!r} must look like key=rate or key=rate/burst")
        rate_s, slash, burst_s = value.strip().partition("/")
        try:
            rate = float(rate_s)
            burst = float(burst_s) if slash else None
        except ValueError:
            raise ValueError(f"entry {item!r} has a value that is not a number") from None
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"entry {item!r}: rate must be a positive number per second")
        if burst is not None and not (burst >= 1 and math.isfinite(burst)):
            raise ValueError(f"entry {item!r}: burst must be at least 1")
        result[key] = RateSpec(rate, burst)
    return result
