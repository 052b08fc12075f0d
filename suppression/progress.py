"""A small text progress bar for long CLI work, written to stderr (stdout stays for data)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """`label [######......]  45%  4500/10000`, redrawn in place on a terminal.

    When the stream is not a terminal (logs, CI) a plain line is written at every tenth of the
    work instead, so the output stays readable.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        *,
        stream: TextIO | None = None,
        width: int = 30,
        unit: str = "",
        min_interval: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.width = width
        self.unit = unit
        self.min_interval = min_interval
        self.done = 0
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_draw = 0.0
        self._last_tenth = -1

    def update(self, done: int, total: int | None = None) -> None:
        """Set the amount of work done (and, if it became known, the total)."""
        self.done = done
        if total is not None:
            self.total = total
        if self._tty:
            now = time.monotonic()
            if now - self._last_draw >= self.min_interval:
                self._last_draw = now
                self.stream.write("\r" + self._line())
                self.stream.flush()
            return
        tenth = self._tenth()
        if tenth is not None and tenth > self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self._line() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """Draw the final state and end the line."""
        if self._tty:
            self.stream.write("\r" + self._line() + "\n")
        elif self._tenth() != self._last_tenth or self.total is None:
            self.stream.write(self._line() + "\n")
        self.stream.flush()

    def _tenth(self) -> int | None:
        if not self.total:
            return None
        return min(10, self.done * 10 // self.total)

    def _line(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.label} {self.done}{unit}"
        share = min(1.0, self.done / self.total)
        filled = int(share * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {share:4.0%} {self.done}/{self.total}{unit}"
