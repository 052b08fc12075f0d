"""`./dev test` installs Debian's chromium for the browser tests when it is missing and the
script runs as root, and leaves the system alone otherwise (stand-ins for apt-get and id)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.test_dev_script import _project


def _stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(tmp_path: Path, *, uid: int, chromium: Path) -> tuple[int, list[str]]:
    (tmp_path / "project").mkdir()
    project = _project(tmp_path / "project")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    _stub(bin_dir, "apt-get", f'echo "$*" >> {log}\n')
    _stub(bin_dir, "id", f"echo {uid}\n")
    # The stand-in uv creates .venv/bin/gateway; `./dev test` runs .venv/bin/pytest.
    (project / ".venv" / "bin").mkdir(parents=True)
    _stub(project / ".venv" / "bin", "pytest", 'echo "pytest $*"\n')
    answer = subprocess.run(
        ["./dev", "test", "-q"],
        cwd=project,
        env={
            **os.environ,
            "PYTHON": sys.executable,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "DEV_CHROMIUM": str(chromium),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip().endswith("pytest -q")
    return answer.returncode, log.read_text().splitlines() if log.exists() else []


def test_root_installs_a_missing_chromium(tmp_path: Path) -> None:
    _, calls = _run(tmp_path, uid=0, chromium=tmp_path / "missing")
    assert calls == ["update -qq", "install -y -qq chromium"]


def test_nothing_is_installed_when_present_or_not_root(tmp_path: Path) -> None:
    present = tmp_path / "chromium"
    present.write_text("")
    present.chmod(0o755)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _run(tmp_path / "a", uid=0, chromium=present)[1] == []
    assert _run(tmp_path / "b", uid=1000, chromium=tmp_path / "missing")[1] == []
