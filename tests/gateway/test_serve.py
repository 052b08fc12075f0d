"""`gateway serve` on its embedded default, in a subprocess, as an operator would start it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.process import GATEWAY, clean_env, free_port, wait_answering


@pytest.fixture
def workdir() -> Iterator[Path]:
    # A short path: the embedded PostgreSQL puts its Unix socket in the data dir.
    path = Path(tempfile.mkdtemp(prefix="gws"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(cwd: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port)],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out, err


def test_serve_with_no_configuration_then_restart(workdir: Path) -> None:
    port = free_port()
    first = _start(workdir, port)
    try:
        response = wait_answering(first, port)
        assert response.status_code == 200, response.text
        assert response.json()["checks"]["database"]["ok"] is True
    finally:
        out, err = _stop(first)
    keys = [line for line in out.splitlines() if "gw_" in line]
    assert len(keys) == 1, out
    admin = keys[0].rsplit(" ", 1)[-1]
    assert "DEVELOPMENT SECRETS" in err
    assert (workdir / ".gateway" / "dev-secrets.json").exists()

    second = _start(workdir, port)
    try:
        assert wait_answering(second, port).status_code == 200
        # the key printed at the first start still works; no new key is printed
        listed = httpx.get(
            f"http://127.0.0.1:{port}/v1/keys", headers={"Authorization": f"Bearer {admin}"}
        )
        assert listed.status_code == 200
        assert len(listed.json()) == 1
    finally:
        out2, _ = _stop(second)
    assert "gw_" not in out2


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"GATEWAY_EMAIL_PROVIDER": "carrier-pigeon"}, "GATEWAY_EMAIL_PROVIDER"),
        ({"GATEWAY_RETRY_MAX_ATTEMPTS": "many"}, "GATEWAY_RETRY_MAX_ATTEMPTS"),
        ({"GATEWAY_SECRET_KEYS": "not-a-fernet-key"}, "GATEWAY_SECRET_KEYS"),
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL"),
        ({"GATEWAY_SMS_PROVIDER": "twilio"}, "GATEWAY_TWILIO_ACCOUNT_SID"),
    ],
)
def test_bad_configuration_exits_2_with_one_line(
    workdir: Path, env: dict[str, str], name: str
) -> None:
    proc = subprocess.run(
        [GATEWAY, "serve", "--port", str(free_port())],
        cwd=workdir,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert name in lines[0]
    assert "Traceback" not in proc.stderr
    # nothing was started or created
    assert not (workdir / ".gateway").exists()
