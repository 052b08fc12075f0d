"""Outbound webhook settings: the embedded default allows local receivers, a deployment does
not unless told; the schedule and timeouts are validated."""

from __future__ import annotations

import base64

import pytest
from cryptography.fernet import Fernet

from gateway.settings import SettingsError, load_settings
from webhooks.outbound.settings import DEFAULT_RETRY_SCHEDULE, parse_retry_schedule

DEPLOYED = {
    "DATABASE_URL": "postgresql://u:p@db/gw",
    "GATEWAY_SECRET_KEYS": Fernet.generate_key().decode(),
    "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(b"k" * 32).decode(),
}


def test_the_sandbox_default_allows_private_addresses_a_deployment_does_not() -> None:
    assert load_settings({}).outbound.allow_private is True
    deployed = load_settings(DEPLOYED).outbound
    assert deployed.allow_private is False
    assert (
        deployed.retry_schedule
        == DEFAULT_RETRY_SCHEDULE
        == (
            5.0,
            300.0,
            1800.0,
            7200.0,
            18000.0,
            36000.0,
            36000.0,
        )
    )
    assert deployed.disable_after_seconds == 5 * 86400
    assert load_settings(
        {**DEPLOYED, "GATEWAY_WEBHOOK_ALLOW_PRIVATE": "true"}
    ).outbound.allow_private
    assert not load_settings({"GATEWAY_WEBHOOK_ALLOW_PRIVATE": "false"}).outbound.allow_private


def test_outbound_knobs() -> None:
    s = load_settings(
        {
            **DEPLOYED,
            "GATEWAY_WEBHOOK_RETRY_SCHEDULE": "1, 2.5,60",
            "GATEWAY_WEBHOOK_DISABLE_AFTER_SECONDS": "3600",
            "GATEWAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS": "1",
            "GATEWAY_WEBHOOK_READ_TIMEOUT_SECONDS": "2",
            "GATEWAY_WEBHOOK_CONCURRENCY": "8",
            "GATEWAY_WEBHOOK_ENDPOINT_CONCURRENCY": "2",
        }
    ).outbound
    assert s.retry_schedule == (1.0, 2.5, 60.0) and s.disable_after_seconds == 3600
    assert (s.connect_timeout_seconds, s.read_timeout_seconds) == (1.0, 2.0)
    assert (s.concurrency, s.endpoint_concurrency) == (8, 2)
    assert parse_retry_schedule("none") == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GATEWAY_WEBHOOK_RETRY_SCHEDULE", "5,soon"),
        ("GATEWAY_WEBHOOK_RETRY_SCHEDULE", "-1"),
        ("GATEWAY_WEBHOOK_RETRY_SCHEDULE", "nan"),
        ("GATEWAY_WEBHOOK_RETRY_SCHEDULE", "inf"),
        ("GATEWAY_WEBHOOK_ALLOW_PRIVATE", "maybe"),
        ("GATEWAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS", "0"),
        ("GATEWAY_WEBHOOK_ENDPOINT_CONCURRENCY", "0"),
        ("GATEWAY_WEBHOOK_CA_BUNDLE", "/nonexistent/ca.pem"),
    ],
)
def test_bad_values_name_their_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({**DEPLOYED, name: value})
    assert caught.value.name == name


def test_the_push_worker_runs_wherever_the_retry_worker_runs() -> None:
    from gateway.worker import background_tasks, run_webhook_pusher, run_worker

    on = list(background_tasks(load_settings(DEPLOYED), in_server=False))
    assert run_worker in on and run_webhook_pusher in on
    off = load_settings({**DEPLOYED, "GATEWAY_WORKER_ENABLED": "false"})
    assert run_webhook_pusher not in list(background_tasks(off, in_server=True))
