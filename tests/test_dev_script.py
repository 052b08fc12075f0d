"""`./dev` syncs the locked dependencies only when uv.lock, pyproject.toml or the script itself
changed since the last successful sync (a stamp in .venv), and always on a fresh clone.

The script runs for real, in a copy of the project's top level whose `.tools/bin/uv` is a
stand-in that records its calls and creates the virtualenv's `gateway` entry point."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE_UV = """#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> uv-calls.log
[ -n "${FAIL_SYNC:-}" ] && exit 1
mkdir -p .venv/bin
printf '#!/usr/bin/env bash\\necho "gateway $*"\\n' > .venv/bin/gateway
chmod +x .venv/bin/gateway
"""


def _project(tmp: Path) -> Path:
    for name in ("dev", "uv.lock", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp / name)
    uv = tmp / ".tools" / "bin" / "uv"
    uv.parent.mkdir(parents=True)
    uv.write_text(FAKE_UV)
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    return tmp


def _dev(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["./dev", *args],
        cwd=project,
        env={**os.environ, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _syncs(project: Path) -> int:
    log = project / "uv-calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_sync_runs_once_then_only_after_a_change(tmp_path: Path) -> None:
    project = _project(tmp_path)
    first = _dev(project, "keys", "list")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "gateway keys list"
    assert _syncs(project) == 1
    assert "sync" in (project / "uv-calls.log").read_text()
    assert "--extra test" in (project / "uv-calls.log").read_text()

    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 1  # nothing changed: no sync

    with (project / "uv.lock").open("a") as lock:
        lock.write("\n# changed\n")
    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 2

    with (project / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n# changed\n")
    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 3
    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 3


def test_a_failed_sync_is_retried_and_a_missing_venv_resynced(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert _dev(project, "keys", "list").returncode == 0
    with (project / "uv.lock").open("a") as lock:
        lock.write("\n# changed\n")
    failed = _dev(project, "keys", "list", FAIL_SYNC="1")
    assert failed.returncode != 0
    assert _syncs(project) == 2
    # The failed sync left no stamp: the next call syncs again.
    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 3
    shutil.rmtree(project / ".venv")  # a fresh clone / removed virtualenv
    assert _dev(project, "keys", "list").returncode == 0
    assert _syncs(project) == 4
