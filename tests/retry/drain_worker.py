"""A retry worker process for the concurrency drill (run as `python -m tests.retry.drain_worker`).

Its dispatch POSTs the delivery id to the stub provider and marks the delivery sent: the unit
under test is the claim/lock/drain of `retry.worker.Worker`, not the send path. It prints
`ready`, waits for `go` on stdin (so that all processes start together), drains until nothing
has been due for a few rounds, and prints how many deliveries it claimed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

import httpx
from sqlalchemy import update

from gateway.db import create_engine, session_factory
from retry.settings import RetrySettings
from retry.worker import Worker
from sender import log as delivery_log
from tests.support.tables import deliveries


async def main(database_url: str, stub_url: str, batch: int, concurrency: int) -> None:
    engine = create_engine(database_url, pool_size=concurrency + 2)
    sessions = session_factory(engine)
    client = httpx.AsyncClient(timeout=30.0)

    async def dispatch(delivery_id: uuid.UUID) -> str:
        response = await client.post(stub_url, json={"id": str(delivery_id)})
        response.raise_for_status()
        async with sessions() as s, s.begin():
            await s.execute(
                update(deliveries).where(deliveries.c.id == delivery_id).values(status="sent")
            )
        return "sent"

    settings = RetrySettings(worker_batch=batch, worker_concurrency=concurrency)
    worker = Worker(engine, delivery_log, dispatch, settings)
    async with engine.connect():
        pass
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    claimed = idle = 0
    while idle < 3:
        result = await worker.run_once()
        claimed += result.claimed
        if result.claimed == 0:
            idle += 1
            await asyncio.sleep(0.05)
        else:
            idle = 0
    await client.aclose()
    await engine.dispose()
    print(json.dumps({"claimed": claimed}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
