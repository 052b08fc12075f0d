"""Fixtures of the retry suite."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from gateway.settings import Settings
from retry.settings import RetrySettings
from tests.retry.helpers import StubProvider


@pytest.fixture
def stub() -> Iterator[StubProvider]:
    """A running stub provider answering 200 unless scripted otherwise."""
    with StubProvider() as provider:
        yield provider


@pytest.fixture
def retry_settings(settings: Settings) -> RetrySettings:
    """Fast retry settings for tests (fractions of a second)."""
    return dataclasses.replace(
        settings.retry,
        base_seconds=0.05,
        max_seconds=1.0,
        max_attempts=4,
        worker_poll_seconds=0.01,
        worker_batch=20,
        worker_concurrency=4,
        defer_seconds=0.05,
        rate_limits={},
    )
