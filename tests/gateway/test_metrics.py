"""`GET /metrics` exposes the webhook counters in Prometheus text format."""

from __future__ import annotations

import httpx

from gateway.metrics import render
from webhooks.errors import VERIFICATION_FAILURES


def _value(text: str, name: str, **labels: str) -> int:
    pairs = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{pairs}}} "):
            return int(line.rsplit(" ", 1)[1])
    return 0


async def test_a_refused_webhook_is_counted_and_exposed(client: httpx.AsyncClient) -> None:
    before = _value(
        render(),
        "gateway_webhook_verification_failures_total",
        provider="twilio",
        reason="no_token_configured",
    )
    refused = await client.post("/webhooks/twilio/status", data={"MessageSid": "SM1"})
    assert refused.status_code == 403
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE gateway_provider_events_total counter" in response.text
    after = _value(
        response.text,
        "gateway_webhook_verification_failures_total",
        provider="twilio",
        reason="no_token_configured",
    )
    assert after == before + 1


def test_label_values_are_escaped() -> None:
    VERIFICATION_FAILURES[("ses", 'odd"reason\n')] += 1
    try:
        assert 'reason="odd\\"reason\\n"' in render()
    finally:
        del VERIFICATION_FAILURES[("ses", 'odd"reason\n')]
