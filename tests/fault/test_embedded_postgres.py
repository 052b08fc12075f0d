"""Defect 5 of the fault drills: the embedded PostgreSQL of `gateway serve` never outlives the
gateway, and its death is repaired (restart) or ends the gateway with a non-zero status.

Each test starts `gateway serve` with no configuration in a fresh directory, as an operator
would, and looks at the postmaster through its `postmaster.pid` file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.embedded import EXIT_DATABASE_LOST
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering

# Bounds that only guard against a hang (the assertions are about outcomes, not speed).
EXIT_TIMEOUT = 60.0


@pytest.fixture
def workdir() -> Iterator[Path]:
    # A short path: the embedded PostgreSQL puts its Unix socket in the data dir.
    path = Path(tempfile.mkdtemp(prefix="gwf"))
    yield path
    pid = _postmaster_pid(path)
    if pid is not None and _running(pid):  # never leave one behind, whatever happened
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def _postmaster_pid(workdir: Path) -> int | None:
    for pgdata in (workdir / ".gateway" / "pg", workdir / ".gateway" / "pg.moved"):
        pidfile = pgdata / "postmaster.pid"
        if pidfile.exists():
            return int(pidfile.read_text().split("\n", 1)[0])
    return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for our purpose.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return True
        time.sleep(0.1)
    return False


def _start(cwd: Path, port: int, workers: int = 1) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port), "--workers", str(workers)],
        cwd=cwd,
        env=clean_env(GATEWAY_WORKER_ENABLED="false"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ready(proc: subprocess.Popen[str], port: int) -> None:
    r = wait_answering(proc, port)
    assert r.status_code == 200, r.text


def _wait_exit(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"gateway did not exit:\n{err}") from None
    return proc.returncode, err


@pytest.mark.parametrize(
    ("sig", "workers"),
    # SIGTERM to a single process is the end of test_a_dead_embedded_server_is_restarted.
    [(signal.SIGINT, 1), (signal.SIGTERM, 2)],
    ids=["sigint", "sigterm-2-workers"],
)
def test_the_embedded_server_stops_with_the_gateway(
    workdir: Path, sig: signal.Signals, workers: int
) -> None:
    port = free_port()
    proc = _start(workdir, port, workers)
    try:
        _ready(proc, port)
        pid = _postmaster_pid(workdir)
        assert pid is not None and _running(pid)
    finally:
        proc.send_signal(sig)
        status, err = _wait_exit(proc)
    assert status == 0, err
    assert _wait_gone(pid), f"postmaster {pid} outlived the gateway:\n{err}"


def test_a_dead_embedded_server_is_restarted(workdir: Path) -> None:
    port = free_port()
    proc = _start(workdir, port)
    try:
        _ready(proc, port)
        # The first start prints the admin key in a box on stderr, before it answers.
        assert proc.stderr is not None
        admin = ""
        while not admin:
            line = proc.stderr.readline()
            assert line, "stderr ended without an admin key"
            if "export KEY=" in line:
                admin = line.split("export KEY=", 1)[1].split()[0]
        assert admin.startswith("gw_"), admin
        first = _postmaster_pid(workdir)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert _wait_gone(first)

        # The watchdog starts it again; the pooled connections to the dead one are dropped.
        deadline = time.monotonic() + EXIT_TIMEOUT
        while time.monotonic() < deadline:
            r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
            assert r.status_code in (200, 503), r.text
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text
        second = _postmaster_pid(workdir)
        assert second is not None and second != first and _running(second)
        keys = httpx.get(
            f"http://127.0.0.1:{port}/v1/keys",
            headers={"Authorization": f"Bearer {admin}"},
            timeout=10,
        )
        assert keys.status_code == 200, keys.text
    finally:
        proc.send_signal(signal.SIGTERM)
        status, err = _wait_exit(proc)
    assert status == 0, err
    assert "restarting it" in err
    assert _wait_gone(second)


def test_an_embedded_server_that_cannot_restart_ends_the_gateway(workdir: Path) -> None:
    port = free_port()
    proc = _start(workdir, port)
    try:
        _ready(proc, port)
        pid = _postmaster_pid(workdir)
        assert pid is not None
        # Its data directory goes away with it: it cannot be started again.
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid)
        (workdir / ".gateway" / "pg").rename(workdir / ".gateway" / "pg.moved")
        status, err = _wait_exit(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert status == EXIT_DATABASE_LOST, err
    assert "could not be restarted" in err
