"""Pure helpers of the bench runner: medians, ratios to floors, pass/fail, the result table."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of the result table.

    `target` is a comparison: `(">=", 0.4)` means "figure / floor >= 0.4" when `floor` is
    set, else "figure >= 0.4"; `("<=", 3.0)` likewise. `figure` None means not measured (n/a).
    """

    scenario: str
    figure: float | None
    unit: str
    floor: float | None = None
    floor_name: str = ""
    target: tuple[str, float] | None = None
    reps: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """figure / floor, when both are known."""
        if self.figure is None or not self.floor:
            return None
        return self.figure / self.floor

    @property
    def verdict(self) -> str:
        """ "pass", "FAIL", "n/a" (not measured) or "" (no target)."""
        if self.figure is None:
            return "n/a"
        if self.target is None:
            return ""
        op, bound = self.target
        value = self.ratio if self.floor else self.figure
        if value is None:
            return "n/a"
        return "pass" if compare(value, op, bound) else "FAIL"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = self.ratio
        out["verdict"] = self.verdict
        out["target"] = target_text(self)
        out["target_op"], out["target_bound"] = self.target or (None, None)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        """The row `as_dict` wrote (see results/*.json)."""
        op, bound = data.get("target_op"), data.get("target_bound")
        return cls(
            scenario=data["scenario"],
            figure=data["figure"],
            unit=data["unit"],
            floor=data.get("floor"),
            floor_name=data.get("floor_name", ""),
            target=(op, bound) if op is not None and bound is not None else None,
            reps=data.get("reps", []),
            note=data.get("note", ""),
        )


def compare(value: float, op: str, bound: float) -> bool:
    """`value op bound` for op in >=, >, <=, <."""
    if op == ">=":
        return value >= bound
    if op == ">":
        return value > bound
    if op == "<=":
        return value <= bound
    if op == "<":
        return value < bound
    raise ValueError(f"unknown comparison {op!r}")


def median(values: Iterable[float | None]) -> float | None:
    """The median of the known values (None when there are none)."""
    known = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(known) if known else None


def fmt_number(value: float | None) -> str:
    """A figure for the table: thousands separators, 3 significant digits for small ones."""
    if value is None:
        return "n/a"
    magnitude = abs(value)
    if magnitude >= 100 or value == int(value):
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def target_text(row: Row) -> str:
    """The target as written in the table, e.g. ">= 40 % of send floor" or "<= 3 ms"."""
    if row.target is None:
        return ""
    op, bound = row.target
    if row.floor_name:
        if bound >= 2:
            return f"{op} {bound:g}x {row.floor_name}"
        return f"{op} {bound * 100:g} % of {row.floor_name}"
    return f"{op} {fmt_number(bound)} {row.unit}"


def table(rows: Sequence[Row]) -> str:
    """A Markdown table: scenario, figure, unit, floor, ratio, target, result."""
    header = ["scenario", "figure", "unit", "floor", "ratio", "target", "result"]
    lines = [header]
    for row in rows:
        ratio = row.ratio
        lines.append(
            [
                row.scenario + (f" ({row.note})" if row.note else ""),
                fmt_number(row.figure),
                row.unit,
                f"{fmt_number(row.floor)} {row.floor_name}".strip() if row.floor else "",
                f"{ratio:.2f}" if ratio is not None else "",
                target_text(row),
                row.verdict,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {1, 3, 4}

    def render(cells: list[str]) -> str:
        padded = [
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(cells)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if i in numeric else "-" * (w + 2) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([render(lines[0]), rule, *(render(line) for line in lines[1:])])


def main() -> None:
    """``python -m benchmarks.report results/before.json``: print a results file's table."""
    import json
    import sys
    from pathlib import Path

    data = json.loads(Path(sys.argv[1]).read_text())
    print(table([Row.from_dict(r) for r in data["rows"]]))
    for note in data.get("notes", []):
        print(f"note: {note}")


if __name__ == "__main__":
    main()
