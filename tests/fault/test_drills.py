"""The fault drills of `tests.fault.drills`, scaled down to run with the suite.

Full size: `./dev drill kill9|database|redis|slow|all` (see the README's Reliability section).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.services import Services
from tests.fault import drills
from tests.support.leaks import find_leaks


def _passed(outcome: drills.Outcome, workdir: Path) -> None:
    assert not outcome.problems, "\n".join(
        [f"answers: {dict(outcome.record.statuses)}", *outcome.problems[:30]]
    )
    # The gateway processes' own log output (crashes, outages and all) names no recipient.
    for log in workdir.rglob("gateway.log"):
        assert find_leaks(log.read_text(errors="replace")) == [], log


def test_kill9_during_sends_and_callbacks(
    clean_database: str, redis_url: str, tmp_path: Path
) -> None:
    outcome = asyncio.run(
        drills.kill9_drill(clean_database, redis_url, tmp_path, sends=300, kills=1)
    )
    _passed(outcome, tmp_path)
    assert outcome.record.accepted_messages
    assert outcome.record.stored_callbacks


def test_database_unreachable_under_load(
    clean_database: str, redis_url: str, tmp_path: Path
) -> None:
    outcome = asyncio.run(
        drills.database_drill(clean_database, redis_url, tmp_path, seconds=9, outage=3)
    )
    _passed(outcome, tmp_path)


def test_redis_lost_and_back(clean_database: str, redis_url: str, tmp_path: Path) -> None:
    outcome = asyncio.run(
        drills.redis_drill(clean_database, redis_url, tmp_path, seconds=8, outage=3)
    )
    _passed(outcome, tmp_path)
    assert outcome.record.statuses["send:500"] == 0


@pytest.mark.parametrize("sends", [16])
def test_slow_provider_holds_no_connection(
    clean_database: str, redis_url: str, tmp_path: Path, sends: int
) -> None:
    outcome = asyncio.run(
        drills.slow_provider_drill(clean_database, redis_url, tmp_path, sends=sends, delay=1.0)
    )
    _passed(outcome, tmp_path)


async def test_a_burst_beyond_the_redis_pool_waits_instead_of_failing(services: Services) -> None:
    # 200 concurrent sends asked the shared circuit breaker at once and got redis-py's
    # "Too many connections" (a 500) beyond its default pool of 100.
    answers = await asyncio.gather(*(services.breaker.allow("twilio") for _ in range(300)))
    assert all(answers)
