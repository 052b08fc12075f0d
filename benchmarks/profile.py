"""Sampling profiles of a gateway process under a bench load (py-spy), and their summary.

``./dev bench --profile DIR`` records each load scenario of the first repetition with
``py-spy record --format raw`` (collapsed stacks, one ``frame;frame;... count`` line per
stack) into ``DIR/<scenario>.txt`` and prints where the gateway's CPU went: the share of
samples by the package of the innermost frame (self time) and the heaviest functions.
``python -m benchmarks.profile DIR/send.txt`` prints the same summary for a saved file.

py-spy comes from PyPI: it is used from PATH, else installed once into ``.tools/``.
"""

# ruff: noqa: S603  (runs py-spy and pip)

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "bin"
OWN_PACKAGES = ("sender", "webhooks", "suppression", "retry", "gateway")
# "function (path/to/file.py:123)" as py-spy's raw format writes a frame.
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str:
    """The py-spy executable (installed into .tools/ from PyPI when missing)."""
    found = shutil.which("py-spy") or (
        str(TOOLS / "py-spy") if (TOOLS / "py-spy").exists() else None
    )
    if found:
        return found
    print("bench: py-spy missing, installing it into .tools/ from PyPI", file=sys.stderr)
    subprocess.run([str(TOOLS / "python"), "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    return str(TOOLS / "py-spy")


@dataclass
class Recording:
    """A py-spy process attached to a gateway for the length of one load."""

    proc: subprocess.Popen[bytes]
    output: Path

    def stop(self) -> Path:
        """End the recording (py-spy writes its file on SIGINT) and return the file."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.output


def record(pid: int, output: Path) -> Recording:
    """Start sampling `pid` (and its subprocesses) at 200 Hz into `output`."""
    output.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        py_spy(), "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
        "--subprocesses", "--nonblocking", "--output", str(output),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Recording(proc, output)


def package_of(frame: str) -> str:
    """The top-level package of a frame's file (py-spy names files relative to their
    import root: ``asyncpg/connection.py``), ``stdlib:<name>`` for the standard library,
    or ``(no Python frame)`` for a sample taken in native code outside any frame."""
    match = FRAME.match(frame.strip())
    if not match:
        return "(no Python frame)"
    path = match.group("file")
    if path.startswith("<"):
        return path
    parts = Path(path).parts
    if "site-packages" in parts:
        parts = parts[parts.index("site-packages") + 1 :]
    own = [part for part in parts if part in OWN_PACKAGES]
    if path.startswith("/") and own:
        return own[0]
    top = parts[0].removesuffix(".py") if parts else path
    return f"stdlib:{top}" if top in sys.stdlib_module_names else top


def summarize(path: Path, top: int = 15) -> str:
    """Self time by package and the heaviest functions of one raw py-spy file."""
    by_package: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        leaf = stack.split(";")[-1]
        n = int(count)
        total += n
        by_package[package_of(leaf)] += n
        by_function[leaf.strip()] += n
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total:,} samples (self time)"]
    lines += [f"  {share(n, total)}  {name}" for name, n in by_package.most_common(top)]
    lines.append("  heaviest functions:")
    lines += [f"  {share(n, total)}  {name[:110]}" for name, n in by_function.most_common(top)]
    return "\n".join(lines)


def share(n: int, total: int) -> str:
    """A right-aligned percentage."""
    return f"{100 * n / total:5.1f} %"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(summarize(Path(arg)))
