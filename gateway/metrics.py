"""`GET /metrics`: the process's counters in the Prometheus text exposition format.

Counters are per process (each gateway process is scraped on its own). They hold no personal
data: only provider names, reasons, dispositions and rule keys.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from litestar import MediaType, Response, get

from sender.dispatch import SEND_FLAGS
from webhooks.errors import VERIFICATION_FAILURES
from webhooks.ingest import EVENTS, PROVIDER_FLAGS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exact Content-Type of `/metrics` (Prometheus text exposition format 0.0.4)."""
# Litestar appends `; charset=utf-8` to every text/* media type itself.
_MEDIA_TYPE = "text/plain; version=0.0.4"

# name, help, labels, counter
FAMILIES: tuple[tuple[str, str, tuple[str, str], collections.Counter[tuple[str, str]]], ...] = (
    (
        "gateway_webhook_verification_failures_total",
        "Webhook requests refused by signature verification.",
        ("provider", "reason"),
        VERIFICATION_FAILURES,
    ),
    (
        "gateway_provider_events_total",
        "Verified provider events, by what was done with them.",
        ("provider", "disposition"),
        EVENTS,
    ),
    (
        "gateway_provider_flags_total",
        "Account-level problems reported by provider feedback.",
        ("provider", "rule"),
        PROVIDER_FLAGS,
    ),
    (
        "gateway_provider_send_flags_total",
        "Account-configuration problems revealed by provider answers at send time.",
        ("provider", "rule"),
        SEND_FLAGS,
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render() -> str:
    """Every counter family as Prometheus text."""
    lines: list[str] = []
    for name, help_text, labels, counter in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for key, value in sorted(_items(counter)):
            pairs = ",".join(
                f'{label}="{_escape(v)}"' for label, v in zip(labels, key, strict=True)
            )
            lines.append(f"{name}{{{pairs}}} {value}")
    return "\n".join(lines) + "\n"


def _items(counter: collections.Counter[tuple[str, str]]) -> Iterable[tuple[tuple[str, str], int]]:
    return list(counter.items())  # a copy: handlers may count while we render


@get(
    "/metrics",
    tags=["health"],
    media_type=MediaType.TEXT,
    summary="Process counters (Prometheus text format)",
)
async def metrics() -> Response[str]:
    """The process's counters; no authentication, no personal data."""
    return Response(render(), media_type=_MEDIA_TYPE)
