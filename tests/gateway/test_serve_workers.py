"""`gateway serve --workers N`: several processes on one port, prepared once by the parent."""

from __future__ import annotations

import http.client
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway.keys import hash_secret
from tests.conftest import gateway_env
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering


@pytest.fixture
def workdir() -> Iterator[Path]:
    # A short path: the embedded PostgreSQL puts its Unix socket in the data dir.
    path = Path(tempfile.mkdtemp(prefix="gws"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _insert_admin_key(database_url: str) -> str:
    secret = "gw_test-" + uuid.uuid4().hex
    engine = create_engine(make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, name, secret_hash, scopes, created_at)"
                    " VALUES (:id, 'workers test', :hash, ARRAY['admin'], now())"
                ),
                {"id": uuid.uuid4(), "hash": hash_secret(secret)},
            )
    finally:
        engine.dispose()
    return secret


def _workers(proc: subprocess.Popen[str], count: int, timeout: float = 60.0) -> list[int]:
    """The PIDs of the serving processes uvicorn spawned under `proc` (waits for `count`)."""
    deadline = time.monotonic() + timeout
    while True:
        children = [
            child.pid
            for child in psutil.Process(proc.pid).children()
            if "spawn_main" in " ".join(child.cmdline())
        ]
        if len(children) >= count or time.monotonic() > deadline:
            return children
        time.sleep(0.1)


def _served_by(port: int, path: str, headers: dict[str, str], pids: list[int]) -> tuple[int, int]:
    """Send one request on a new connection; return its status and the PID of the worker that
    holds the server side of that connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        assert conn.sock is not None
        client_port = conn.sock.getsockname()[1]
        for pid in pids:
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == client_port:
                    return response.status, pid
        return response.status, 0
    finally:
        conn.close()


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"serve did not stop on SIGTERM:\n{out}\n{err}") from None
    return out, err


def test_serve_with_two_workers(clean_database: str, redis_url: str) -> None:
    secret = _insert_admin_key(clean_database)
    port = free_port()
    env = clean_env(
        **gateway_env(
            clean_database, redis_url, GATEWAY_REDIS_PREFIX=f"gwtest:{uuid.uuid4().hex[:8]}:"
        )
    )
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_answering(proc, port, "/healthz").status_code == 200
        pids = _workers(proc, 2)
        assert len(pids) == 2, pids
        answered: set[int] = set()
        auth = {"Authorization": f"Bearer {secret}"}
        # the second worker may still be starting: a guard against hanging, not a timing test
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            status, pid = _served_by(port, "/v1/keys", auth, pids)
            assert status == 200
            answered.add(pid)
            if answered == set(pids):
                break
        assert answered == set(pids)
        bad = _served_by(port, "/v1/keys", {"Authorization": "Bearer gw_nope"}, pids)
        assert bad[0] == 401
    finally:
        _out, err = _stop(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_workers_must_be_positive() -> None:
    proc = subprocess.run(
        [GATEWAY, "serve", "--workers", "0"], env=clean_env(), capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "--workers" in proc.stderr


def test_embedded_default_with_two_workers(workdir: Path) -> None:
    """The parent starts the embedded PostgreSQL, migrates it and prints the admin key once;
    both workers connect to it by URL; it stops with the parent."""
    port = free_port()
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port), "--workers", "2"],
        cwd=workdir,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    head: list[str] = []
    try:
        ready = wait_answering(proc, port, "/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["checks"]["database"]["ok"] is True
        # The admin key is in the box on stderr (printed before the server answered).
        assert proc.stderr is not None
        secret = ""
        while not secret:
            line = proc.stderr.readline()
            assert line, "stderr ended without an admin key"
            head.append(line)
            if "export KEY=" in line:
                secret = line.split("export KEY=", 1)[1].split()[0]
        assert secret.startswith("gw_")
        pids = _workers(proc, 2)
        assert len(pids) == 2, pids
        for _ in range(4):
            status, _pid = _served_by(port, "/v1/keys", {"Authorization": f"Bearer {secret}"}, pids)
            assert status == 200
    finally:
        out, rest = _stop(proc)
    err = "".join(head) + rest
    assert proc.returncode == 0, err
    assert "gw_" not in out and err.count("export KEY=gw_") == 1  # printed once, by the parent
    assert err.count("DEVELOPMENT SECRETS") == 1  # the workers do not warn again
    assert "Traceback" not in err, err
    assert not (workdir / ".gateway" / "pg" / "postmaster.pid").exists()
