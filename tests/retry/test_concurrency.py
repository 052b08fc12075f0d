"""Drill: 4 worker processes drain 10,000 due deliveries; each is sent exactly once."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gateway.services import Services
from tests.retry.helpers import StubProvider, insert_deliveries
from tests.support.tables import deliveries

ROOT = Path(__file__).resolve().parents[2]
N = 10_000
WORKERS = 4


@pytest.mark.slow
async def test_four_processes_drain_10000_deliveries_exactly_once(
    services: Services, database_url: str, stub: StubProvider
) -> None:
    async with services.sessions() as s, s.begin():
        high = await insert_deliveries(s, N // 2, priority="high", status="retrying")
        low = await insert_deliveries(s, N - N // 2, priority="low", status="queued")
    ids = {str(i) for i in high + low}
    assert len(ids) == N

    url = services.settings.database_url or database_url
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.retry.drain_worker",
            url,
            stub.url,
            "50",
            "8",
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(WORKERS)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert (await p.stdout.readline()).decode().strip() == "ready"
        for p in procs:  # start together
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            await p.stdin.drain()
        results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 240)
        claimed = []
        logs = "\n".join(err.decode() for _, err in results)
        for p, (out, _) in zip(procs, results, strict=True):
            assert p.returncode == 0, logs
            claimed.append(json.loads(out.decode().strip().splitlines()[-1])["claimed"])
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()

    # every delivery reached the provider exactly once ...
    calls = Counter(c.recipient for c in stub.calls)
    assert set(calls) == ids, logs
    assert set(calls.values()) == {1}, logs
    # ... by claims that add up with no overlap, spread over all the processes
    assert sum(claimed) == N, logs
    assert all(c > 0 for c in claimed), (claimed, logs)
    # ... and none was left behind
    async with services.sessions() as s:
        left = await s.scalar(
            select(func.count()).where(
                (deliveries.c.status != "sent") | deliveries.c.next_attempt_at.is_not(None)
            )
        )
    assert left == 0
