"""A campaign expansion process for the kill -9 drill (run as
`python -m tests.sender.expand_campaign <batch>`, configured by the gateway environment).

It runs the expansion job's batches back to back, printing `batch <n>` after each committed
one, until no campaign has work left; the test kills it with SIGKILL in the middle.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.services import build_services
from gateway.settings import load_settings


async def main(batch: int) -> None:
    settings = load_settings()
    assert settings.database_url is not None
    services = build_services(settings, settings.database_url)
    try:
        while True:
            expanded = await services.campaigns.expand_once(batch=batch)
            if expanded.campaign_id is None:
                break
            print(f"batch {expanded.recipients}", flush=True)
    finally:
        await services.close()
    print("idle", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
