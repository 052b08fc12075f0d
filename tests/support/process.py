"""Running `gateway` as a subprocess: its executable, a clean environment, a free port, and
waiting until it answers HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

GATEWAY = str(Path(sys.executable).with_name("gateway"))
"""The `gateway` console script of the test virtualenv."""


def clean_env(**extra: str) -> dict[str, str]:
    """The process environment without any gateway, database, Redis or AWS configuration,
    plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith(("GATEWAY_", "AWS_")) or k in ("DATABASE_URL", "REDIS_URL"))
    }
    env.update(extra)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (just now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _text(stream: str | bytes | None) -> str:
    if isinstance(stream, bytes):
        return stream.decode(errors="replace")
    return stream or ""


def wait_answering(
    proc: subprocess.Popen[Any], port: int, path: str = "/readyz", timeout: float = 90.0
) -> httpx.Response:
    """Poll `GET path` on the gateway in `proc` until it answers (any status); fail with its
    output if it exits first, or kill it if it never answers within `timeout` seconds (a guard
    against hanging, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"gateway exited {proc.returncode}:\n{_text(out)}\n{_text(err)}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2.0)
        except httpx.HTTPError as exc:
            last = exc
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"gateway did not answer within {timeout}s: {last}")
