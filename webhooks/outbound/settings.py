"""The push side's knobs: retry schedule, failure window, timeouts, concurrency, SSRF rule.

A plain dataclass that `gateway.settings` fills in from the environment. The schedule parser
lives here, next to the code that interprets it; it raises `ValueError` with a message, which
the settings loader turns into a `SettingsError` naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY = 86400.0

# Seconds between a failed try and the next one: the Standard Webhooks reference schedule
# (after the immediate first try: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h), then failed.
DEFAULT_RETRY_SCHEDULE: tuple[float, ...] = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)


@dataclass(frozen=True)
class OutboundSettings:
    """Outbound webhook knobs (consumed by `webhooks.outbound`)."""

    # Lift the SSRF rules (https only; no loopback, private, link-local, metadata, ...
    # addresses) for development and tests. The embedded default turns it on.
    allow_private: bool = False
    retry_schedule: tuple[float, ...] = DEFAULT_RETRY_SCHEDULE
    # An endpoint whose every try failed for this long is disabled (reason `failing`).
    disable_after_seconds: float = 5 * DAY
    connect_timeout_seconds: float = 5.0
    read_timeout_seconds: float = 15.0
    # Pushes under way at once in one process, and towards one endpoint from one process.
    concurrency: int = 32
    endpoint_concurrency: int = 4
    # How often an idle worker looks for new events and due deliveries.
    poll_seconds: float = 1.0
    # Events read from the feed per endpoint and round.
    fanout_batch: int = 500
    # A PEM bundle of extra CA certificates to trust for endpoints (a private CA; tests);
    # None: the system's default trust store.
    ca_bundle: str | None = None
    # How long the previous signing secret keeps signing after a rotation.
    secret_overlap_seconds: float = DAY


def parse_retry_schedule(raw: str) -> tuple[float, ...]:
    """Parse `GATEWAY_WEBHOOK_RETRY_SCHEDULE`: comma-separated seconds between tries, e.g.
    `5,300,1800` (three retries after the first try, then the event is failed); `none` for no
    retry at all."""
    if raw.strip().lower() == "none":
        return ()
    values: list[float] = []
    for part in raw.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"must be comma-separated seconds (got {part!r})") from None
        if not 0.0 <= value <= 30 * DAY:
            raise ValueError(f"each delay must be between 0 and 30 days (got {part!r})")
        values.append(value)
    if len(values) > 50:
        raise ValueError("at most 50 retries")
    return tuple(values)
