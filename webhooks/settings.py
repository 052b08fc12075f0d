"""The feedback path's knobs: soft-bounce policy, feedback retry cap, classification overrides.

A plain dataclass that `gateway.settings` fills in from the environment (and re-exports as
`gateway.settings.WebhookSettings`). The override parser lives here, next to the code that
interprets it; it raises `ValueError` with a message, which the settings loader turns into a
`SettingsError` naming the variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

DAY = 86400.0


@dataclass(frozen=True)
class WebhookSettings:
    """Feedback processing knobs (consumed by `webhooks.ingest.FeedbackIngestor`)."""

    # N soft bounces of one address within the window (with no delivery to it in between)
    # put a temporary `soft_bounce` suppression on it, which expires after the given time.
    soft_bounce_threshold: int = 3
    soft_bounce_window_seconds: float = 7 * DAY
    soft_bounce_suppression_seconds: float = 3 * DAY
    # Cap of one feedback-caused retry delay (the base is GATEWAY_RETRY_FEEDBACK_BASE_SECONDS).
    feedback_retry_max_seconds: float = 6 * 3600.0
    # Classification table key -> outcome name (see webhooks.classify), replacing defaults.
    classification_overrides: Mapping[str, str] = field(default_factory=dict)


def parse_classification_overrides(raw: str) -> dict[str, str]:
    """Parse the JSON object of `GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES`.

    Keys are classification table keys (``<provider>:...`` of a provider whose feedback is
    classified: ``ses``, ``twilio`` and any registered one), values outcome names of
    `webhooks.classify.OVERRIDABLE_OUTCOMES`.
    """
    from webhooks.classify import OVERRIDABLE_OUTCOMES, providers

    try:
        parsed = json.loads(raw)
    except ValueError:
        raise ValueError("must be a JSON object of table key -> outcome") from None
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object of table key -> outcome")
    result: dict[str, str] = {}
    for key, value in parsed.items():
        known = sorted(providers())
        if key.partition(":")[0] not in known or ":" not in key or len(key) > 200:
            names = " or ".join(f"'{name}:'" for name in known)
            raise ValueError(f"key {key[:60]!r} must start with {names}")
        if not isinstance(value, str) or value not in OVERRIDABLE_OUTCOMES:
            raise ValueError(
                f"value of {key!r} must be one of {', '.join(sorted(OVERRIDABLE_OUTCOMES))}"
            )
        result[key] = value
    return result
