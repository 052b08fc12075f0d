"""`gateway suppressions import|export|check|add|remove`, run in-process (a worker thread)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import pytest

from gateway import cli
from gateway.services import Services
from gateway.settings import Settings
from suppression import service
from suppression.normalize import normalize
from tests.conftest import TEST_FERNET_KEYS, TEST_HASH_KEY


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI at the test database with the test keys."""
    assert settings.database_url is not None
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    monkeypatch.setenv("GATEWAY_SECRET_KEYS", ",".join(TEST_FERNET_KEYS))
    monkeypatch.setenv("GATEWAY_HASH_KEY", base64.urlsafe_b64encode(TEST_HASH_KEY).decode())
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "WARNING")


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli.main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.usefixtures("cli_env")
async def test_add_check_and_remove(
    services: Services, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    add = ("suppressions", "add", "--channel", "email")
    code, out, _ = await run(capsys, *add, "--reason", "complaint", "A@Example.com")
    assert code == 0 and json.loads(out)["created"] is True
    assert json.loads(out)["entry"]["address"] == "a@example.com"
    code, out, err = await run(
        capsys, "suppressions", "add", "--channel", "email", "--reason", "complaint",
        "--scope", "news", "b@example.com",
    )  # fmt: skip
    assert code == 1 and "whole channel" in err

    # addresses from stdin, one per line; invalid ones go to stderr
    monkeypatch.setattr("sys.stdin", io.StringIO("a@example.com\nok@example.com\nnot-valid\n"))
    code, out, err = await run(capsys, "suppressions", "check", "--channel", "email")
    assert code == 0 and out == "a@example.com\tcomplaint\tall\n"
    assert "invalid\tnot-valid" in err and "1 suppressed" in err

    code, _, err = await run(
        capsys, "suppressions", "remove", "--channel", "email", "--reason", "asked", "a@example.com"
    )
    assert code == 1 and "--force" in err
    code, out, _ = await run(
        capsys, "suppressions", "remove", "--channel", "email", "--reason", "asked", "--force",
        "a@example.com",
    )  # fmt: skip
    assert code == 0 and [e["reason"] for e in json.loads(out)["removed"]] == ["complaint"]
    async with services.sessions() as s:
        history = await service.history_for(
            s, "email", services.protector.hash("email", "a@example.com")
        )
    assert [(h.action, h.actor.startswith("cli:")) for h in history] == [
        ("add", True),
        ("remove", True),
    ]
    assert history[-1].details == {"removal_reason": "asked", "evidence": {"forced": True}}


@pytest.mark.usefixtures("cli_env")
async def test_import_then_export_with_progress(
    services: Services, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = ["email,created,reason,status"]
    rows += [f"user{i}@example.com,1711965600,550 5.1.1 unknown,5.1.1" for i in range(300)]
    rows += ["not-an-address,1711965600,bad,5.1.1"]
    source = tmp_path / "bounces.csv"
    source.write_text("\n".join(rows) + "\n")
    code, out, err = await run(capsys, "suppressions", "import", str(source))
    assert code == 0, err
    report = json.loads(out)
    assert (report["added"], report["already_present"], report["invalid_count"]) == (300, 0, 1)
    assert report["invalid"][0]["line"] == 302
    assert "import [" in err and "100%" in err  # progress over the bytes read

    async with services.sessions() as s:
        await service.add(
            s,
            services.protector,
            normalize("sms", "+12025550143"),
            reason="sms_stop",
            source=service.Source("provider_event", "SM1"),
        )
        await s.commit()
    target = tmp_path / "out.jsonl"
    code, out, err = await run(
        capsys, "suppressions", "export", "--format", "jsonl", "--output", str(target)
    )
    assert code == 0, err
    items = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(items) == 301 and items[-1]["address"] == "+12025550143"
    assert {i["reason"] for i in items[:300]} == {"hard_bounce"}
    assert "export [" in err and "301/301" in err and "exported 301 entries" in err

    unknown = tmp_path / "unknown.csv"
    unknown.write_text("name,phone\nx,y\n")
    code, _, err = await run(capsys, "suppressions", "import", str(unknown))
    assert code == 2 and "unrecognized import format" in err
    code, _, err = await run(capsys, "suppressions", "import", str(tmp_path / "missing.csv"))
    assert code == 1 and "No such file" in err
