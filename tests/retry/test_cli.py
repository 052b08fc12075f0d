"""`gateway dlq list|show|redrive|discard` and `gateway worker`, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid

import pytest
from sqlalchemy import select, text

from gateway.cli import main
from gateway.services import Services
from retry.models import DeadLetter
from tests.conftest import gateway_env
from tests.retry.helpers import insert_deliveries
from tests.retry.test_dlq_api import T0, _dead
from tests.support.process import GATEWAY
from tests.support.tables import deliveries


def _env(services: Services, **extra: str) -> dict[str, str]:
    assert services.settings.database_url is not None
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        **gateway_env(services.settings.database_url, services.settings.redis_url, **extra),
        "GATEWAY_REDIS_PREFIX": services.settings.redis_prefix,
    }


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [GATEWAY, "dlq", *args], env=env, capture_output=True, text=True, timeout=60
    )


class InProcess:
    """`gateway dlq ...` through `gateway.cli.main` in a thread (no interpreter start-up per
    command); one command in a real subprocess is enough to cover the entry point."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = await asyncio.to_thread(main, ["dlq", *args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err


async def test_dlq_commands(
    services: Services, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _env(services)
    for name in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gateway = InProcess(capsys)
    expired = await _dead(services, 30, reason="expired", channel="sms")
    (exhausted,) = await _dead(services, 1, reason="max_attempts", channel="email")

    code, out, err = await gateway("list", "--channel", "email")
    assert code == 0, err
    (line,) = out.splitlines()
    columns = line.split("\t")
    assert columns[0] == str(exhausted)
    assert columns[2:6] == ["email", "max_attempts", "open", "dead"]
    code, out, err = await gateway("list", "--json", "--limit", "5")
    assert len([json.loads(x) for x in out.splitlines()]) == 5 and "more entries" in err
    code, out, _ = await gateway("show", str(exhausted))
    assert code == 0
    assert json.loads(out)["attempt_history"][0]["error_code"] == "30003"
    assert (await gateway("show", str(uuid.uuid4())))[0] == 1
    assert (await gateway("show", "nonsense"))[0] == 2

    # bulk redrive needs a filter or --all
    code, _, err = await gateway("redrive")
    assert code == 2 and "--all" in err
    # the bulk redrive as an operator runs it: a process of its own, progress on stderr
    bulk = await _run(env, "redrive", "--reason", "expired", "--since", T0.isoformat())
    assert bulk.returncode == 0, bulk.stderr
    assert "redrive [" in bulk.stderr and "30/30" in bulk.stderr  # the progress bar
    assert "redriven 30 entries" in bulk.stderr and bulk.stdout == ""
    async with services.sessions() as s:
        states = set(
            (await s.execute(select(DeadLetter.resolution).where(DeadLetter.id.in_(expired))))
            .scalars()
            .all()
        )
    assert states == {"redriven"}

    code, _, err = await gateway("discard", str(exhausted), "--reason", "duplicate of order 42")
    assert code == 0, err
    async with services.sessions() as s:
        entry = await s.get(DeadLetter, exhausted)
    assert entry is not None
    assert (entry.resolution, entry.resolution_reason) == ("discarded", "duplicate of order 42")
    assert entry.resolved_by and entry.resolved_by.startswith("cli:")
    code, _, err = await gateway("redrive", str(exhausted))
    assert code == 1 and "discarded" in err
    code, out, _ = await gateway("list", "--state", "all", "--json", "--limit", "100")
    assert len(out.splitlines()) == 31


async def test_gateway_worker_drains_and_stops_on_sigterm(services: Services) -> None:
    to = "+14155552671"
    async with services.sessions() as s, s.begin():
        # a real, dispatchable delivery for the sandbox SMS provider, due now
        (real,) = await insert_deliveries(s, 1, status="queued", next_at=T0)
        await s.execute(
            text(
                "UPDATE deliveries SET recipient_encrypted = :r, recipient_hash = :h WHERE id = :id"
            ),
            {
                "r": services.protector.encrypt(to),
                "h": services.protector.hash("sms", to),
                "id": real,
            },
        )
        await s.execute(
            text(
                "UPDATE messages SET content_encrypted = :c"
                " WHERE id = (SELECT message_id FROM deliveries WHERE id = :id)"
            ),
            {"c": services.protector.encrypt(json.dumps({"body": "hello"})), "id": real},
        )
    proc = await asyncio.create_subprocess_exec(
        GATEWAY,
        "worker",
        env=_env(services, GATEWAY_WORKER_POLL_SECONDS="0.05"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        status = None
        for _ in range(600):  # a guard against hanging, not a timing assertion
            async with services.sessions() as s:
                status = await s.scalar(select(deliveries.c.status).where(deliveries.c.id == real))
            if status == "sent" or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, raw_err = await asyncio.wait_for(proc.communicate(), 30)
        err = raw_err.decode()
        assert status == "sent", err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    assert "retry worker running" in err and "retry worker process stopped" in err
