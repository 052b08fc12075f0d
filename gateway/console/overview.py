"""The overview's figures: per channel and window, sends by final status and the rates that
providers review (pure functions over the counts the owning modules return)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gateway.console.charts import Series, stacked_days
from sender import log as dlog
from sender import status as st

CHANNELS = ("email", "sms")

# SES reviews an account whose bounce rate reaches 5 % or complaint rate 0.1 % (and may pause
# sending at 10 % / 0.5 %): ../shared/PROVIDERS.md. Twilio publishes no such levels for SMS.
REVIEW_LEVELS = {"email": {"bounce": 0.05, "complaint": 0.001}}

# Deliveries the provider took or answered: the base of the rates (SES counts sends).
SENT_TO_PROVIDER = (
    st.SENT,
    st.DELAYED,
    st.DELIVERED,
    st.READ,
    st.BOUNCED,
    st.COMPLAINED,
    st.FAILED,
)
# Order of the status columns on the page.
STATUS_ORDER = st.ALL


@dataclass
class Rate:
    """A rate (None when nothing was sent) and the review level it is held against."""

    value: float | None
    level: float | None = None

    @property
    def over(self) -> bool:
        """At or over the provider's review level."""
        return self.value is not None and self.level is not None and self.value >= self.level

    def text(self) -> str:
        """The rate as a percentage, or a dash."""
        return "\u2013" if self.value is None else f"{self.value * 100:.2f} %"


@dataclass
class Window:
    """One channel's figures over one window."""

    counts: dict[str, int] = field(default_factory=dict)
    deferrals: int = 0

    @property
    def total(self) -> int:
        """Every delivery created in the window."""
        return sum(self.counts.values())

    @property
    def sends(self) -> int:
        """Deliveries handed to the provider (the base of the rates)."""
        return sum(self.counts.get(s, 0) for s in SENT_TO_PROVIDER)

    def rate(self, channel: str, kind: str) -> Rate:
        """bounce / complaint (email) or failure (SMS) rate over the window's sends."""
        status = {"bounce": st.BOUNCED, "complaint": st.COMPLAINED, "failure": st.FAILED}[kind]
        level = REVIEW_LEVELS.get(channel, {}).get(kind)
        if not self.sends:
            return Rate(None, level)
        return Rate(self.counts.get(status, 0) / self.sends, level)


def windows(
    counts: Iterable[dlog.StatusCount], deferrals: dict[str, tuple[int, int]]
) -> dict[str, dict[str, Window]]:
    """channel -> {"24h": Window, "7d": Window}."""
    out = {c: {"24h": Window(), "7d": Window()} for c in CHANNELS}
    for row in counts:
        per = out.setdefault(row.channel, {"24h": Window(), "7d": Window()})
        if row.short:
            per["24h"].counts[row.status] = row.short
        if row.long:
            per["7d"].counts[row.status] = row.long
    for channel, (short, long) in deferrals.items():
        per = out.setdefault(channel, {"24h": Window(), "7d": Window()})
        per["24h"].deferrals = short
        per["7d"].deferrals = long
    return out


_CHART_SERIES = (
    ("delivered or read", "s-ok", (st.DELIVERED, st.READ)),
    ("sent or delayed", "s-sent", (st.SENT, st.DELAYED)),
    ("bounced or complained", "s-bad", (st.BOUNCED, st.COMPLAINED)),
    ("failed or dead", "s-fail", (st.FAILED, st.DEAD)),
    ("suppressed", "s-supp", (st.SUPPRESSED,)),
    ("waiting", "s-wait", tuple(st.DEFERRED)),
)


def daily_charts(
    rows: Sequence[tuple[dt.date, str, str, int]], today: dt.date, days: int = 7
) -> dict[str, object]:
    """channel -> SVG chart of the last `days` UTC days' deliveries by outcome."""
    span = [today - dt.timedelta(days=days - 1 - i) for i in range(days)]
    index = {d: i for i, d in enumerate(span)}
    charts: dict[str, object] = {}
    for channel in CHANNELS:
        series = []
        for name, css, statuses in _CHART_SERIES:
            values = [0] * days
            for day, ch, status, n in rows:
                if ch == channel and status in statuses and day in index:
                    values[index[day]] += n
            series.append(Series(name, css, values))
        charts[channel] = stacked_days(
            f"{channel} deliveries per day, last {days} days", span, series
        )
    return charts


LEGEND = tuple((name, css) for name, css, _ in _CHART_SERIES)
