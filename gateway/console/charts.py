"""Charts drawn by the server as inline SVG: no script, nothing fetched, readable without colour.

Each chart is an `<svg role="img">` with a `<title>` and a description for screen readers; each
bar carries its own `<title>` (shown as a tooltip), and the page shows the same figures in a
table next to it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass(frozen=True)
class Series:
    """One stacked part of every bar: a name, a CSS class (its colour) and a value per bar."""

    name: str
    css: str
    values: Sequence[int]


WIDTH = 560
HEIGHT = 180
_LEFT = 40
_BOTTOM = 24
_TOP = 8


def stacked_days(title: str, days: Sequence[dt.date], series: Sequence[Series]) -> Markup:
    """A stacked bar per day (oldest left), with a y axis labelled at zero and the maximum."""
    totals = [sum(s.values[i] for s in series) for i in range(len(days))]
    peak = max(totals, default=0) or 1
    plot_h = HEIGHT - _BOTTOM - _TOP
    slot = (WIDTH - _LEFT) / max(len(days), 1)
    bar_w = max(slot * 0.6, 1)
    summary = "; ".join(
        f"{day.isoformat()}: "
        + (", ".join(f"{s.values[i]} {s.name}" for s in series if s.values[i]) or "none")
        for i, day in enumerate(days)
    )
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title><desc>{escape(summary)}</desc>",
        f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{HEIGHT - _BOTTOM}"/>',
        f'<line class="axis" x1="{_LEFT}" y1="{HEIGHT - _BOTTOM}" x2="{WIDTH}" '
        f'y2="{HEIGHT - _BOTTOM}"/>',
        f'<text class="tick" x="{_LEFT - 4}" y="{_TOP + 10}" text-anchor="end">{peak}</text>',
        f'<text class="tick" x="{_LEFT - 4}" y="{HEIGHT - _BOTTOM}" text-anchor="end">0</text>',
    ]
    for i, day in enumerate(days):
        x = _LEFT + i * slot + (slot - bar_w) / 2
        y = float(HEIGHT - _BOTTOM)
        for s in series:
            value = s.values[i]
            if not value:
                continue
            h = plot_h * value / peak
            y -= h
            parts.append(
                f'<rect class="{escape(s.css)}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{h:.1f}"><title>{escape(day.isoformat())}: {value} '
                f"{escape(s.name)}</title></rect>"
            )
        parts.append(
            f'<text class="tick" x="{x + bar_w / 2:.1f}" y="{HEIGHT - 8}" '
            f'text-anchor="middle">{escape(day.strftime("%m-%d"))}</text>'
        )
    parts.append("</svg>")
    # Every text and attribute value above went through `escape`.
    return Markup("".join(parts))  # noqa: S704
