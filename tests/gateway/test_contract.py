"""The contract, machine-checked: schemathesis with every check against `openapi.yaml`, on a
`gateway serve` process with real PostgreSQL and Redis, authenticated with an admin key.

Settings (and the few documented exceptions) are in `schemathesis.toml` next to this file.
The webhooks answer 403 to every generated request (no provider signature), as documented.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import gateway_env
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering

ROOT = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))
# Test cases per operation and phase: enough to cover every parameter and status, bounded so
# the whole run stays well under two minutes on a small machine.
MAX_EXAMPLES = 25


@pytest.fixture
def server(clean_database: str, redis_url: str, tmp_path: Path) -> Iterator[str]:
    """`gateway serve` on the test servers (retry worker off); yields its base URL."""
    port = free_port()
    env = clean_env(
        **gateway_env(
            clean_database,
            redis_url,
            GATEWAY_REDIS_PREFIX=f"gwcontract:{port}:",
            GATEWAY_DATA_DIR=str(tmp_path / "data"),
            GATEWAY_WORKER_ENABLED="false",
            GATEWAY_LOG_LEVEL="WARNING",
        )
    )
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_answering(proc, port, "/readyz").status_code == 200
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        # Anything the fuzzing made the gateway log as an unhandled error is a finding too.
        assert "unhandled error" not in err, err[-4000:]


async def test_schemathesis_finds_nothing(
    server: str, make_key: Callable[..., Awaitable[str]], tmp_path: Path
) -> None:
    admin = await make_key("admin", name="contract")
    command = [
        SCHEMATHESIS,
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        str(ROOT / "openapi.yaml"),
        "--url",
        server,
        "--header",
        f"Authorization: Bearer {admin}",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
    ]
    result = subprocess.run(  # noqa: ASYNC221  (the test waits for the run, nothing else)
        command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-4000:]
    assert "49 selected / 49 total" in result.stdout  # every operation of the document
