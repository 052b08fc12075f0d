"""`GET /metrics`: every family present and moving after sandbox traffic (scraped with
prometheus-client's parser), label values free of recipients, keys and message ids, the
multiprocess mode (counters summed over processes, database gauges computed once)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from gateway import metrics as gateway_metrics
from gateway.metrics import CONTENT_TYPE, database_families
from gateway.services import Services
from gateway.settings import Settings
from retry.settings import RateSpec
from sender import log as dlog
from suppression.db import pg_connection, utcnow
from tests.conftest import bearer, gateway_env, replace_settings
from tests.gateway.test_serve_workers import _insert_admin_key
from tests.sender.helpers import email, sms
from tests.support.leaks import find_leaks
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering

# The sandbox's default SMS sender: its rate-limit key (a sender identity) is allowed in labels.
SMS_KEY = "twilio:+15005550006"
RECIPIENTS = (
    "success@simulator.amazonses.com",
    "bounce@simulator.amazonses.com",
    "+14155552671",
    "+14155552672",
    "+14155552673",
    "+14155552674",
    "+14155552675",
)

# Every family the issue asks for, by its exposed name (counters without `_total`).
FAMILIES = {
    "gateway_sends": "counter",
    "gateway_provider_call_seconds": "histogram",
    "gateway_http_request_seconds": "histogram",
    "gateway_suppression_hits": "counter",
    "gateway_webhook_verification_failures": "counter",
    "gateway_provider_events": "counter",
    "gateway_callback_lag_seconds": "histogram",
    "gateway_retry_queue_depth": "gauge",
    "gateway_retry_oldest_due_age_seconds": "gauge",
    "gateway_dlq_depth": "gauge",
    "gateway_circuit_breaker_state": "gauge",
    "gateway_rate_limit_grants": "counter",
    "gateway_rate_limit_deferrals": "counter",
    "gateway_reputation_ratio": "gauge",
    "gateway_outbound_event_backlog": "gauge",
    "gateway_provider_flags": "counter",
    "gateway_provider_send_flags": "counter",
    "gateway_metrics_database_ok": "gauge",
}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A bucket of 3 tokens (the least with the default low-priority share) refilled once in
    # 1,000 s for the sandbox's SMS sender: a five-recipient SMS defers two of them.
    retry = dataclasses.replace(
        settings.retry, rate_limits={**settings.retry.rate_limits, SMS_KEY: RateSpec(0.001, 1)}
    )
    return replace_settings(settings, retry=retry)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """(family name -> type, (sample name, sorted labels) -> value)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(
        value
        for (sample, pairs), value in samples.items()
        if sample == name and set(labels.items()) <= set(pairs)
    )


async def scrape(client: httpx.AsyncClient) -> tuple[dict[str, str], Samples, str]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    types, samples = parse(response.text)
    return types, samples, response.text


async def _send(client: httpx.AsyncClient, secret: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(
        "/v1/messages", json=body, headers={**bearer(secret), "Idempotency-Key": uuid.uuid4().hex}
    )
    assert r.status_code in (201, 202), r.text
    answer: dict[str, Any] = r.json()
    return answer


async def _traffic(
    client: httpx.AsyncClient, services: Services, secret: str
) -> list[dict[str, Any]]:
    """Sandbox traffic touching every family: sends (accepted, bounced), their callbacks, a
    suppressed resend, a rate-limited SMS, a refused webhook and a dead letter."""
    answers = [
        await _send(client, secret, email(["success@simulator.amazonses.com"])),
        await _send(client, secret, email(["bounce@simulator.amazonses.com"])),
    ]
    await services.sandbox_feedback.drain()
    answers.append(await _send(client, secret, email(["bounce@simulator.amazonses.com"])))
    answers.append(await _send(client, secret, sms(list(RECIPIENTS[2:]))))
    await services.sandbox_feedback.drain()
    refused = await client.post("/webhooks/twilio/status", data={"MessageSid": "SM1"})
    assert refused.status_code == 403
    # A dead letter, filed through the delivery log as the worker would.
    queued = [d["id"] for d in answers[-1]["deliveries"] if d["status"] == "queued"]
    assert queued, answers[-1]
    async with pg_connection(services.engine) as conn:
        await dlog.dead_letter(
            conn, uuid.UUID(queued[0]), reason="max_attempts", last_error=None, now=utcnow()
        )
    return answers


def _ids(answers: Iterable[dict[str, Any]]) -> set[str]:
    return {a["id"] for a in answers} | {d["id"] for a in answers for d in a["deliveries"]}


async def test_every_family_is_present_and_moves_after_sandbox_traffic(
    client: httpx.AsyncClient, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("send", "read")
    types, before, _ = await scrape(client)
    for name, kind in FAMILIES.items():
        assert types.get(name) == kind, (name, types.get(name))
    await _traffic(client, services, secret)
    types, after, _ = await scrape(client)

    def moved(name: str, **labels: str) -> bool:
        return total(after, name, **labels) > total(before, name, **labels)

    assert moved("gateway_sends_total", channel="email", provider="ses", outcome="accepted")
    assert moved("gateway_sends_total", channel="sms", provider="twilio", outcome="accepted")
    assert moved("gateway_provider_call_seconds_count", channel="email", provider="ses")
    assert moved("gateway_http_request_seconds_count", method="POST", route="/v1/messages")
    assert moved(
        "gateway_suppression_hits_total", channel="email", reason="hard_bounce", scope="all"
    )
    assert moved(
        "gateway_webhook_verification_failures_total",
        provider="twilio",
        reason="no_token_configured",
    )
    assert moved("gateway_provider_events_total", provider="ses", disposition="applied")
    assert moved("gateway_callback_lag_seconds_count", provider="ses")
    assert moved("gateway_rate_limit_grants_total", key=SMS_KEY, priority="normal")
    assert moved("gateway_rate_limit_deferrals_total", key=SMS_KEY, priority="normal")
    # Database families: the two deferred SMS wait on the queue, one of them now dead.
    assert total(after, "gateway_retry_queue_depth", channel="sms", status="queued") == 1
    assert total(after, "gateway_dlq_depth", reason="max_attempts") == 1
    assert total(after, "gateway_circuit_breaker_state", provider="ses", state="closed") == 1
    assert total(after, "gateway_metrics_database_ok") == 1
    # The oldest due delivery's age, seen from an hour later.
    later = await database_families(services, now=utcnow() + dt.timedelta(hours=1))
    ages = {
        s.labels["channel"]: s.value
        for f in later
        if f.name == "gateway_retry_oldest_due_age_seconds"
        for s in f.samples
    }
    assert ages["sms"] > 3000 and ages["email"] == 0


async def test_label_values_hold_no_recipient_key_or_message_id(
    client: httpx.AsyncClient, services: Services, make_key: Callable[..., Awaitable[str]]
) -> None:
    secret = await make_key("send", "read")
    answers = await _traffic(client, services, secret)
    views = [
        (await client.get(f"/v1/messages/{a['id']}", headers=bearer(secret))).json()
        for a in answers
    ]
    provider_ids = {
        d["provider_message_id"] for v in views for d in v["deliveries"] if d["provider_message_id"]
    }
    assert provider_ids
    forbidden = {*RECIPIENTS, secret, *_ids(answers), *provider_ids}
    _, samples, text = await scrape(client)
    values = {v for _, pairs in samples for _, v in pairs}
    assert SMS_KEY in values  # a sender identity: allowed
    leaks = {f for f in forbidden for v in values if f in v or f.lower() in v.lower()}
    assert leaks == set()
    # Nor anywhere in the exposition (help texts included).
    assert [f for f in forbidden if f in text] == []


async def test_the_hooks_render_reputation_rates_and_the_outbound_backlog(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, samples, _ = await scrape(client)
    assert total(samples, "gateway_reputation_ratio") == 0
    assert total(samples, "gateway_outbound_event_backlog") == 0  # no pending push

    async def rates(services: Services, conn: Any) -> list[tuple[str, str, float]]:
        return [("mail.example.com", "bounce", 0.03), ("mail.example.com", "complaint", 0.001)]

    async def backlog(services: Services, conn: Any) -> int:
        return 7

    monkeypatch.setattr(gateway_metrics, "reputation_rates", rates)
    monkeypatch.setattr(gateway_metrics, "outbound_backlog", backlog)
    _, samples, _ = await scrape(client)
    assert total(samples, "gateway_reputation_ratio", identity="mail.example.com", kind="bounce")
    assert total(samples, "gateway_outbound_event_backlog") == 7


_COUNT_IN_A_CHILD = textwrap.dedent(
    """
    import sys
    from webhooks.errors import VERIFICATION_FAILURES
    for _ in range(int(sys.argv[1])):
        VERIFICATION_FAILURES.labels("twilio", "bad_signature").inc()
    """
)


def test_multiprocess_counters_are_summed_over_processes(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for n in (2, 3):
        subprocess.run([sys.executable, "-c", _COUNT_IN_A_CHILD, str(n)], env=env, check=True)
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file per process
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    value = registry.get_sample_value(
        "gateway_webhook_verification_failures_total",
        {"provider": "twilio", "reason": "bad_signature"},
    )
    assert value == 5


def test_serve_with_two_workers_sums_counters_and_computes_gauges_once(
    clean_database: str, redis_url: str, tmp_path: Path
) -> None:
    """`gateway serve --workers 2`: every scrape (whichever worker answers) shows the
    requests of both workers once, and the queue depth as the database has it (not twice)."""
    port = free_port()
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999999.db").write_bytes(b"stale")  # a dead process's file
    env = clean_env(
        **gateway_env(
            clean_database,
            redis_url,
            GATEWAY_DATA_DIR=str(tmp_path / "data"),
            GATEWAY_METRICS_DIR=str(metrics_dir),
            GATEWAY_WORKER_ENABLED="false",
            GATEWAY_LOG_FORMAT="json",
            GATEWAY_RATE_LIMITS=f"{SMS_KEY}=0.001/1",
            GATEWAY_REDIS_PREFIX=f"gwm:{uuid.uuid4().hex[:8]}:",
        )
    )
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_answering(proc, port)
        assert not (metrics_dir / "counter_999999999.db").exists()
        base = f"http://127.0.0.1:{port}"
        refused = 8
        for _ in range(refused):
            # A new connection each: the kernel spreads them over the two workers.
            r = httpx.post(f"{base}/webhooks/twilio/status", data={"MessageSid": "SM1"})
            assert r.status_code == 403
        secret = _insert_admin_key(clean_database)
        r = httpx.post(
            f"{base}/v1/messages",
            json=sms(list(RECIPIENTS[2:])),
            headers={**bearer(secret), "Idempotency-Key": uuid.uuid4().hex},
        )
        assert r.status_code == 202, r.text  # three tokens: two of the five wait queued
        with pg_sync(clean_database) as count_queued:
            expected_queue = count_queued()
        assert expected_queue == 2
        for _ in range(6):
            r = httpx.get(f"{base}/metrics", headers={"Connection": "close"})
            assert r.status_code == 200
            _, samples = parse(r.text)
            assert (
                total(
                    samples,
                    "gateway_webhook_verification_failures_total",
                    provider="twilio",
                    reason="no_token_configured",
                )
                == refused
            )
            assert total(samples, "gateway_retry_queue_depth") == expected_queue
            assert total(samples, "gateway_dlq_depth") == 0
            assert (
                total(samples, "gateway_circuit_breaker_state", provider="twilio", state="closed")
                == 1
            )
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    # The processes' own log output (JSON lines) names none of the recipients.
    assert err.strip() and find_leaks(err) == []


class pg_sync:
    """A synchronous count of the queued deliveries (the test's view of the database)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        self.engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))

    def __enter__(self) -> Callable[[], int]:
        from sqlalchemy import text

        def count() -> int:
            with self.engine.connect() as conn:
                return int(
                    conn.execute(
                        text("SELECT count(*) FROM deliveries WHERE next_attempt_at IS NOT NULL")
                    ).scalar_one()
                )

        return count

    def __exit__(self, *exc: object) -> None:
        self.engine.dispose()


def test_an_unwritable_metrics_directory_falls_back_to_a_private_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prometheus_client import values

    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    saved = values.ValueClass
    try:
        path = gateway_metrics.enable_multiprocess(
            Settings(metrics_dir=blocked / "metrics"), clean=True
        )
        assert path.is_dir() and path != blocked / "metrics"
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(path)
        path.rmdir()
    finally:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        values.ValueClass = saved
