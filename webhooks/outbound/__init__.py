"""Outbound webhooks: pushing the gateway's events to upstream endpoints, signed per the
Standard Webhooks specification (endpoints, fan-out from the event feed, delivery worker,
SSRF guard)."""
