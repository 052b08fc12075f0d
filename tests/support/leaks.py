"""A pytest plugin: no log line of the whole test run may hold an address, a phone number or
a message body the suite uses.

At the start of the session it installs a handler on the root logger, sets the root logger to
DEBUG (every level of every library is produced) and formats each record with the gateway's
own JSON formatter (`gateway.logs`: what a gateway process would write). Each line is
scanned by `find_leaks`, which looks further than the formatter's own redaction (bare digits
of the suite's phone numbers, URL-encoded addresses, marked bodies). A hit fails the session
(exit status 1) with the logger names and the masked findings. Tests that capture a gateway
subprocess's output scan it with `find_leaks` themselves.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from gateway.logs import formatter

# Email addresses (also URL-encoded), E.164 numbers (also URL-encoded), the suite's phone
# numbers written without `+` (what a redaction keyed on `+` would miss), and body markers.
LEAK_PATTERNS = (
    re.compile(r"[A-Za-z0-9._%+'-]+(?:@|%40|%2540)[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+", re.I),
    re.compile(r"(?:\+|%2B|%252B)[1-9]\d{6,14}(?!\d)", re.I),
    re.compile(r"(?<![\d.])1(?:415555|500555|202555|415867|800555|888888|336443)\d{4}(?!\d)"),
    re.compile(r"BODY-MARKER-[0-9a-f]{8}"),
)


def find_leaks(text: str) -> list[str]:
    """Every substring of `text` that looks like personal data the suite uses."""
    return [m.group(0) for pattern in LEAK_PATTERNS for m in pattern.finditer(text)]


class LeakScanner(logging.Handler):
    """Formats every record as the gateway would and keeps the lines that leak."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(formatter("json"))
        self.found: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Scan one record."""
        try:
            line = self.format(record)
        except Exception:  # a record that cannot be formatted cannot leak through it either
            return
        for hit in find_leaks(line):
            self.found.append((record.name, hit))


_scanner = LeakScanner()


def pytest_configure(config: pytest.Config) -> None:
    """Install the scanner for the whole session."""
    root = logging.getLogger()
    root.addHandler(_scanner)
    root.setLevel(logging.DEBUG)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep the DEBUG records this plugin makes pytest capture out of the reports (which the
    terminal reporter keeps for the whole session): only lines of the levels captured before
    it (INFO and above) stay in a failing test's "Captured log" sections."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    sections = []
    for title, text in report.sections:
        if title.startswith("Captured log"):
            text = "\n".join(line for line in text.splitlines() if not line.startswith("DEBUG"))
            if report.passed or not text.strip():
                continue
        sections.append((title, text))
    report.sections = sections


def _masked(hit: str) -> str:
    return hit[:3] + "*" * max(0, len(hit) - 3)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when any log line leaked."""
    logging.getLogger().removeHandler(_scanner)
    if not _scanner.found:
        return
    loggers = sorted({name for name, _ in _scanner.found})
    sample = sorted({_masked(hit) for _, hit in _scanner.found})[:10]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"personal data in {len(_scanner.found)} log line(s) of loggers {loggers}: {sample}"
    if reporter is not None:
        reporter.write_line(f"LOG LEAK: {message}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def findings() -> Iterator[tuple[str, str]]:
    """What the session's scanner found so far (logger, text)."""
    return iter(list(_scanner.found))
