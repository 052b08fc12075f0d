"""The shared state of the rate limiter and the circuit breaker (Redis) being unreachable.

When Redis does not answer, the limiter cannot tell whether a token is left and the breaker
whether the circuit is open. The send path then fails safe: the delivery is deferred
(`queued`, reason `deferred: rate limiter unavailable`), the provider is not called and no
attempt is counted; it goes out once Redis answers again (the worker retries it every
GATEWAY_RETRY_DEFER_SECONDS within its deadline). Falling back to a per-process limiter
instead would let N processes send N times the configured rate, which is what the shared
limit exists to prevent.

`SharedStateOutage` logs the outage once when it starts and once when it ends (not a
traceback per request); `/readyz` reports Redis itself.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("retry.shared")

UNAVAILABLE_REASON = "deferred: rate limiter unavailable"
"""The reason of a delivery deferred because the shared limiter/breaker state is unreachable."""


class SharedStateUnavailable(RuntimeError):
    """Redis (rate-limit buckets, breaker state) did not answer."""


class SharedStateOutage:
    """Tracks whether the shared state answers; logs each change of that state once."""

    def __init__(self, name: str = "Redis (rate limiter and circuit breaker)") -> None:
        self.name = name
        self.down_since: float | None = None
        self.last_error: str | None = None

    @property
    def available(self) -> bool:
        """False from a failed call until the next successful one."""
        return self.down_since is None

    def failed(self, exc: BaseException) -> SharedStateUnavailable:
        """Record a failed call (logged only when the outage starts); the error to raise."""
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "%s unavailable (%s): sends are deferred (%r) until it answers again",
                self.name,
                self.last_error,
                UNAVAILABLE_REASON,
            )
        return SharedStateUnavailable(f"{self.name} unavailable: {self.last_error}")

    def succeeded(self) -> None:
        """Record a successful call (logged only when it ends an outage)."""
        if self.down_since is not None:
            log.warning(
                "%s available again after %.1fs", self.name, time.monotonic() - self.down_since
            )
            self.down_since = None
            self.last_error = None


__all__ = ["UNAVAILABLE_REASON", "SharedStateOutage", "SharedStateUnavailable"]
