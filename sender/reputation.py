"""The reputation guard: bounce/complaint rates per sending identity, and pauses before SES
(or the carriers) pause us.

SES reviews an account at 5 % bounces or 0.1 % complaints and may pause it at 10 % / 0.5 %
(../shared/PROVIDERS.md, SES-ENF). The guard keeps each sending identity under those levels:

* **Identity.** Email: the From domain (lower case) of the message (`from`, else
  GATEWAY_EMAIL_FROM). The configuration set is not used: the gateway sends every email
  through one (GATEWAY_SES_CONFIGURATION_SET), so it would be the whole account, while a
  domain is what SES verifies and what mailbox providers judge. SMS: the From number (the
  message's `from`, else GATEWAY_SMS_FROM) or, without one, the Messaging Service SID.
  The identity is stored on each delivery when it is claimed (`deliveries.sender_identity`).
* **Counting, as SES counts.** Over the window (GATEWAY_REPUTATION_WINDOW_HOURS, deliveries
  created since then): a *send* is a delivery the provider accepted (it has a provider
  message id); a *bounce* is a delivery that ended `bounced` (permanent: transient bounces
  are retried and never count, as at SES); a *complaint* one that ended `complained` (a
  `not-spam` report is not a complaint). Bounces and complaints SES produced itself for an
  address on the account's suppression list (subtype `OnAccountSuppressionList`) count as
  sends but not as bounces or complaints: SES does not count them either. SMS: a *failure*
  is an accepted delivery that ended `failed` (undelivered/failed callback), an *opt-out* one
  Twilio refused or failed with 21610 (the recipient texted STOP at Twilio); a 21610 refused
  at send time also counts as a send.
* **Levels.** With at least GATEWAY_REPUTATION_MIN_SENDS sends in the window, a rate at or
  over the first pair of thresholds pauses the identity's `marketing` sends
  (`marketing_paused`), over the second pair every send (`all_paused`). A paused delivery is
  deferred `queued` (no attempt counted, no rate-limit token spent) and the worker tries it
  again later; its deadline and GATEWAY_RETRY_MAX_DEFERRAL_SECONDS still bound the wait.
* **Resume.** Automatic when the rates fall back under the thresholds (next evaluation), or
  by an operator (`resume`): that holds for GATEWAY_REPUTATION_RESUME_HOURS or until the
  rates fall back under the thresholds, whichever comes first; a crossing of a *higher*
  level than the one resumed still pauses at once.
* **Budget.** Rates are never computed on the send path: the worker evaluates them every
  GATEWAY_REPUTATION_EVALUATE_SECONDS with one set-based statement into
  `reputation_states`; the send path asks `ReputationGuard.verdict`, an in-process view of
  the paused identities refreshed from that table at most every
  GATEWAY_REPUTATION_REFRESH_SECONDS (in the background: a send never waits for it except
  the process's very first one).

Every statement on `reputation_states` and `reputation_history` lives in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from sender import log as dlog
from suppression.crypto import AddressProtector
from suppression.db import Pg, jsonb, pg_connection, utcnow
from suppression.normalize import normalize

log = logging.getLogger("gateway.reputation")

OK = "ok"
MARKETING_PAUSED = "marketing_paused"
ALL_PAUSED = "all_paused"
STATES: tuple[str, ...] = (OK, MARKETING_PAUSED, ALL_PAUSED)
ReputationStateName = Literal["ok", "marketing_paused", "all_paused"]
# The pause level of each state: 0 none, 1 marketing, 2 everything.
LEVEL: dict[str, int] = {OK: 0, MARKETING_PAUSED: 1, ALL_PAUSED: 2}
STATE_OF_LEVEL: dict[int, str] = {v: k for k, v in LEVEL.items()}

# The names of the two rates of each channel (API, metrics).
RATE_KINDS: dict[str, tuple[str, str]] = {
    "email": ("bounce", "complaint"),
    "sms": ("failure", "opt_out"),
}
# The bounce/complaint subtype of SES's own suppression list (not counted by SES).
SES_ACCOUNT_SUPPRESSED = "OnAccountSuppressionList"
# Twilio: the recipient has opted out (texted STOP) of this sender.
TWILIO_OPT_OUT = "21610"
# SES counts no mail to its mailbox simulator toward the rates (its reputation dashboard
# documentation): deliveries to these addresses are left out of the count entirely (exact
# addresses; `bounce+label@...` is counted, the hash cannot see the label).
SIMULATOR_ADDRESSES: tuple[str, ...] = tuple(
    f"{kind}@simulator.amazonses.com"
    for kind in ("success", "bounce", "ooto", "complaint", "suppressionlist", "blacklist")
)
# The actor of automatic changes in the history.
GUARD_ACTOR = "guard"
# How a delivery deferred by the guard is marked (`deliveries.reason`).
REASON_PREFIX = "paused: reputation guard"
# pg_try_advisory_xact_lock key: one evaluation at a time across processes.
_LOCK_KEY = 0x7265707574  # "reput"


# -- settings and pure rules ----------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """Percent thresholds of one channel: `first` is the bounce (email) or failure (SMS)
    rate, `second` the complaint (email) or opt-out (SMS) rate; `*_marketing` pause marketing
    sends, `*_all` every send."""

    first_marketing: float
    second_marketing: float
    first_all: float
    second_all: float


EMAIL_THRESHOLDS = Thresholds(4.0, 0.08, 8.0, 0.4)
SMS_THRESHOLDS = Thresholds(10.0, 1.0, 20.0, 3.0)


@dataclass(frozen=True)
class ReputationSettings:
    """The guard's knobs (GATEWAY_REPUTATION_*, read by gateway.settings)."""

    enabled: bool = True
    window_hours: float = 24.0
    min_sends: int = 500
    email: Thresholds = EMAIL_THRESHOLDS
    sms: Thresholds = SMS_THRESHOLDS
    evaluate_seconds: float = 60.0
    refresh_seconds: float = 5.0
    resume_hours: float = 24.0

    def thresholds(self, channel: str) -> Thresholds:
        """The thresholds of `channel` (email or sms)."""
        return self.sms if channel == "sms" else self.email


@dataclass(frozen=True)
class Counts:
    """What the window holds for one identity (for SMS: failures and opt-outs)."""

    sends: int = 0
    bounces: int = 0
    complaints: int = 0


def rates(counts: Counts) -> tuple[float, float]:
    """(first, second) rate in percent of the sends; 0 without sends."""
    if counts.sends <= 0:
        return 0.0, 0.0
    return 100.0 * counts.bounces / counts.sends, 100.0 * counts.complaints / counts.sends


def level_of(counts: Counts, thresholds: Thresholds, min_sends: int) -> int:
    """The pause level the counts call for: 0 none, 1 marketing, 2 everything. Below the
    minimum volume nothing is paused (a handful of sends says nothing about a rate)."""
    if counts.sends < max(min_sends, 1):
        return 0
    first, second = rates(counts)
    if first >= thresholds.first_all or second >= thresholds.second_all:
        return 2
    if first >= thresholds.first_marketing or second >= thresholds.second_marketing:
        return 1
    return 0


@dataclass(frozen=True)
class Standing:
    """An identity's stored state: the state and since when, and an operator's hold."""

    state: str = OK
    since: dt.datetime | None = None
    hold_level: int = 0
    hold_until: dt.datetime | None = None


def decide(level: int, previous: Standing | None, now: dt.datetime) -> Standing:
    """The new standing of an identity whose counts call for `level` (pure).

    An operator's hold (`hold_level`, until `hold_until`) suppresses pauses up to its level;
    it ends when it expires or when the counts call for no pause (so the next crossing
    pauses again), and a higher level than the held one pauses at once."""
    previous = previous or Standing(since=now)
    hold_level, hold_until = previous.hold_level, previous.hold_until
    if not hold_level or level == 0 or hold_until is None or now >= hold_until:
        hold_level, hold_until = 0, None
    effective = 0 if hold_level and level <= hold_level else level
    state = STATE_OF_LEVEL[effective]
    since = previous.since if state == previous.state and previous.since else now
    return Standing(state, since, hold_level, hold_until)


def blocks(state: str | None, category: str) -> bool:
    """Does `state` stop a send of `category`?"""
    level = LEVEL.get(state or OK, 0)
    return level >= 2 or (level == 1 and category == "marketing")


def identity_of(channel: str, sender: str | None) -> str | None:
    """The sending identity of a message: the From domain of an email (`Name <a@b>` too),
    the From number or Messaging Service SID of an SMS; None when there is none."""
    if not sender:
        return None
    value = sender.strip()
    if channel != "email":
        return value[:255] or None
    if value.endswith(">") and "<" in value:
        value = value[value.rindex("<") + 1 : -1]
    if "@" not in value:
        return None
    domain = value.rsplit("@", 1)[1].strip().rstrip(".").lower()
    return domain[:255] or None


def deferral_reason(identity: str, state: str) -> str:
    """The `reason` of a delivery the guard deferred."""
    what = "marketing sends" if state == MARKETING_PAUSED else "all sends"
    return f"{REASON_PREFIX}: {what} of {identity} paused (bounce/complaint rate over threshold)"


# -- statements -----------------------------------------------------------------------------

_STATE_COLUMNS = (
    "identity, channel, state, since, sends, bounces, complaints, evaluated_at, hold_level, "
    "hold_until, resumed_by, resumed_at, resume_reason"
)

_UPSERT = """
INSERT INTO reputation_states AS r (identity, channel, state, since, sends, bounces,
    complaints, evaluated_at, hold_level, hold_until)
SELECT u.identity, u.channel, u.state, u.since, u.sends, u.bounces, u.complaints, $8,
    u.hold_level, u.hold_until
FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::int[], $6::int[],
    $7::int[], $9::int2[], $10::timestamptz[])
    AS u(identity, channel, state, since, sends, bounces, complaints, hold_level, hold_until)
ON CONFLICT (identity) DO UPDATE SET channel = EXCLUDED.channel, state = EXCLUDED.state,
    since = EXCLUDED.since, sends = EXCLUDED.sends, bounces = EXCLUDED.bounces,
    complaints = EXCLUDED.complaints, evaluated_at = EXCLUDED.evaluated_at,
    hold_level = EXCLUDED.hold_level, hold_until = EXCLUDED.hold_until
"""

_HISTORY = """
INSERT INTO reputation_history (id, identity, at, actor, from_state, to_state, reason, details)
SELECT gen_random_uuid(), u.identity, $1, u.actor, u.from_state, u.to_state, u.reason,
    u.details::jsonb
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
    AS u(identity, actor, from_state, to_state, reason, details)
"""


@dataclass(frozen=True)
class StateRow:
    """A row of `reputation_states`."""

    identity: str
    channel: str
    state: str
    since: dt.datetime
    sends: int
    bounces: int
    complaints: int
    evaluated_at: dt.datetime
    hold_level: int
    hold_until: dt.datetime | None
    resumed_by: str | None
    resumed_at: dt.datetime | None
    resume_reason: str | None

    @property
    def counts(self) -> Counts:
        """The counts of the last evaluation."""
        return Counts(self.sends, self.bounces, self.complaints)


def _row(record: Any) -> StateRow:
    return StateRow(*record)


def uncounted_hashes(protector: AddressProtector) -> tuple[str, ...]:
    """The recipient hashes of the mailbox simulator's addresses (never counted)."""
    return tuple(protector.hash("email", normalize("email", a).key) for a in SIMULATOR_ADDRESSES)


async def window_counts(
    conn: Pg, *, since: dt.datetime, uncounted: Sequence[str] = ()
) -> dict[str, tuple[str, Counts]]:
    """identity -> (channel, counts) of the deliveries created since `since`, except those
    to the recipient hashes `uncounted` (the statement belongs to the delivery log,
    `sender.log.identity_counts`)."""
    rows = await dlog.identity_counts(
        conn,
        since=since,
        ses_suppressed=SES_ACCOUNT_SUPPRESSED,
        opt_out=TWILIO_OPT_OUT,
        uncounted=uncounted,
    )
    return {
        r["identity"]: (r["channel"], Counts(r["sends"], r["bounces"], r["complaints"]))
        for r in rows
    }


async def states(conn: Pg, *, lock: bool = False) -> list[StateRow]:
    """Every identity's stored state (with `lock`: rows locked for an evaluation)."""
    suffix = " FOR UPDATE" if lock else ""
    rows = await conn.fetch(
        f"SELECT {_STATE_COLUMNS} FROM reputation_states ORDER BY identity{suffix}"
    )
    return [_row(r) for r in rows]


async def paused(conn: Pg) -> dict[str, str]:
    """identity -> state of the identities that are paused now (the send path's view)."""
    rows = await conn.fetch("SELECT identity, state FROM reputation_states WHERE state <> 'ok'")
    return {r["identity"]: r["state"] for r in rows}


async def state_of(conn: Pg, identity: str) -> StateRow | None:
    """One identity's stored state."""
    row = await conn.fetchrow(
        f"SELECT {_STATE_COLUMNS} FROM reputation_states WHERE identity = $1", identity
    )
    return _row(row) if row is not None else None


@dataclass(frozen=True)
class HistoryRow:
    """One recorded change of an identity's state."""

    at: dt.datetime
    actor: str
    from_state: str | None
    to_state: str
    reason: str
    details: dict[str, Any]


async def history_of(conn: Pg, identity: str, *, limit: int = 20) -> list[HistoryRow]:
    """The latest changes of an identity, newest first."""
    rows = await conn.fetch(
        "SELECT at, actor, from_state, to_state, reason, details FROM reputation_history "
        "WHERE identity = $1 ORDER BY at DESC, id DESC LIMIT $2",
        identity,
        limit,
    )
    return [HistoryRow(*r) for r in rows]


@dataclass(frozen=True)
class Change:
    """An identity whose state changed at an evaluation or by an operator."""

    identity: str
    channel: str
    from_state: str | None
    to_state: str
    actor: str
    reason: str
    counts: Counts


def _details(change: Change, settings: ReputationSettings) -> dict[str, Any]:
    first, second = rates(change.counts)
    t = settings.thresholds(change.channel)
    return {
        "channel": change.channel,
        "sends": change.counts.sends,
        "bounces": change.counts.bounces,
        "complaints": change.counts.complaints,
        "first_rate": round(first, 4),
        "second_rate": round(second, 4),
        "thresholds": [t.first_marketing, t.second_marketing, t.first_all, t.second_all],
        "min_sends": settings.min_sends,
        "window_hours": settings.window_hours,
    }


async def _record(
    conn: Pg, changes: Sequence[Change], settings: ReputationSettings, now: dt.datetime
) -> None:
    if not changes:
        return
    await conn.execute(
        _HISTORY,
        now,
        [c.identity for c in changes],
        [c.actor for c in changes],
        [c.from_state for c in changes],
        [c.to_state for c in changes],
        [c.reason for c in changes],
        [jsonb(_details(c, settings)) for c in changes],
    )


def _log_change(change: Change) -> None:
    # ERROR: a paused identity stops sends (and a resumed one may hurt the account again):
    # an operator must look either way. The identity is ours (a domain, a From number).
    first, second = rates(change.counts)
    log.error(
        "reputation of %s (%s): %s -> %s by %s (%s; sends %d, rates %.3f%% / %.3f%%)",
        change.identity,
        change.channel,
        change.from_state or "new",
        change.to_state,
        change.actor,
        change.reason,
        change.counts.sends,
        first,
        second,
    )


def _why(level: int, previous: Standing, new: Standing) -> str:
    if new.state != OK:
        return "rate at or over the threshold"
    if previous.hold_level and level:
        return "operator resume holds"
    return "rates under the thresholds"


async def evaluate(
    conn: Pg,
    settings: ReputationSettings,
    *,
    now: dt.datetime,
    uncounted: Sequence[str] = (),
    unless_since: dt.datetime | None = None,
) -> tuple[list[StateRow], list[Change]] | None:
    """Count the window, decide every identity's state, store states and changes (in one
    transaction). None when another process is evaluating right now (advisory lock), or when
    some process evaluated at or after `unless_since` (so N worker processes evaluate once
    per interval between them, not N times)."""
    async with conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", _LOCK_KEY):
            return None
        if unless_since is not None:
            last = await conn.fetchval("SELECT max(evaluated_at) FROM reputation_states")
            if last is not None and last >= unless_since:
                return None
        counted = await window_counts(
            conn, since=now - dt.timedelta(hours=settings.window_hours), uncounted=uncounted
        )
        stored = {s.identity: s for s in await states(conn, lock=True)}
        rows: list[StateRow] = []
        changes: list[Change] = []
        for identity in sorted(set(counted) | set(stored)):
            old = stored.get(identity)
            channel, counts = counted.get(identity, (old.channel if old else "email", Counts()))
            level = level_of(counts, settings.thresholds(channel), settings.min_sends)
            previous = (
                Standing(old.state, old.since, old.hold_level, old.hold_until) if old else None
            )
            new = decide(level, previous, now)
            assert new.since is not None
            rows.append(
                StateRow(
                    identity,
                    channel,
                    new.state,
                    new.since,
                    counts.sends,
                    counts.bounces,
                    counts.complaints,
                    now,
                    new.hold_level,
                    new.hold_until,
                    old.resumed_by if old else None,
                    old.resumed_at if old else None,
                    old.resume_reason if old else None,
                )
            )
            if old is None or old.state != new.state:
                if old is None and new.state == OK:
                    continue  # a new identity in good standing: nothing to tell
                changes.append(
                    Change(
                        identity,
                        channel,
                        old.state if old else None,
                        new.state,
                        GUARD_ACTOR,
                        _why(level, previous or Standing(), new),
                        counts,
                    )
                )
        if rows:
            await conn.execute(
                _UPSERT,
                [r.identity for r in rows],
                [r.channel for r in rows],
                [r.state for r in rows],
                [r.since for r in rows],
                [r.sends for r in rows],
                [r.bounces for r in rows],
                [r.complaints for r in rows],
                now,
                [r.hold_level for r in rows],
                [r.hold_until for r in rows],
            )
        await _record(conn, changes, settings, now)
    for change in changes:
        _log_change(change)
    return rows, changes


class UnknownIdentity(LookupError):
    """No identity of this name has been evaluated."""


class NotPaused(Exception):
    """The identity is not paused: there is nothing to resume."""


async def resume(
    conn: Pg,
    identity: str,
    settings: ReputationSettings,
    *,
    actor: str,
    reason: str,
    now: dt.datetime,
) -> StateRow:
    """An operator resumes a paused identity: `ok` now, holding (see `decide`) for
    `resume_hours` or until the rates fall back; recorded with who, when and why."""
    async with conn.transaction():
        row = await conn.fetchrow(
            f"SELECT {_STATE_COLUMNS} FROM reputation_states WHERE identity = $1 FOR UPDATE",
            identity,
        )
        if row is None:
            raise UnknownIdentity(identity)
        old = _row(row)
        if old.state == OK:
            raise NotPaused(identity)
        until = now + dt.timedelta(hours=settings.resume_hours)
        updated = await conn.fetchrow(
            "UPDATE reputation_states SET state = 'ok', since = $2, hold_level = $3, "
            "hold_until = $4, resumed_by = $5, resumed_at = $2, resume_reason = $6 "
            f"WHERE identity = $1 RETURNING {_STATE_COLUMNS}",
            identity,
            now,
            LEVEL[old.state],
            until,
            actor,
            reason,
        )
        change = Change(identity, old.channel, old.state, OK, actor, reason, old.counts)
        await _record(conn, [change], settings, now)
    _log_change(change)
    return _row(updated)


# -- the view the rest of the gateway uses ---------------------------------------------------


async def metric_ratios(conn: Pg) -> list[tuple[str, str, float]]:
    """(identity, kind, ratio 0..1) per identity and rate as last evaluated, for
    `gateway_reputation_ratio` (kinds: `RATE_KINDS`)."""
    out: list[tuple[str, str, float]] = []
    for row in await states(conn):
        first, second = RATE_KINDS.get(row.channel, RATE_KINDS["email"])
        a, b = rates(row.counts)
        out += [(row.identity, first, a / 100.0), (row.identity, second, b / 100.0)]
    return out


async def metric_states(conn: Pg) -> list[tuple[str, str]]:
    """(identity, state) per identity, for `gateway_reputation_state`."""
    return [(row.identity, row.state) for row in await states(conn)]


@dataclass(frozen=True)
class IdentityReputation:
    """One identity as `GET /v1/reputation` and the metrics show it: rates in percent."""

    identity: str
    channel: str
    state: str
    since: dt.datetime
    sends: int
    # Email: bounce and complaint rates; SMS: failure and opt-out rates (percent).
    first_rate: float
    second_rate: float
    thresholds: Thresholds
    min_sends: int
    evaluated_at: dt.datetime
    hold_until: dt.datetime | None
    resumed_by: str | None
    resumed_at: dt.datetime | None
    resume_reason: str | None


def report(row: StateRow, settings: ReputationSettings) -> IdentityReputation:
    """The reported view of one stored state."""
    first, second = rates(row.counts)
    return IdentityReputation(
        identity=row.identity,
        channel=row.channel,
        state=row.state,
        since=row.since,
        sends=row.sends,
        first_rate=first,
        second_rate=second,
        thresholds=settings.thresholds(row.channel),
        min_sends=settings.min_sends,
        evaluated_at=row.evaluated_at,
        hold_until=row.hold_until if row.hold_level else None,
        resumed_by=row.resumed_by,
        resumed_at=row.resumed_at,
        resume_reason=row.resume_reason,
    )


@dataclass
class ReputationGuard:
    """The per-process side of the guard: the send path's cached view of paused identities
    (`verdict`), the worker's periodic evaluation (`maybe_evaluate`), and what the API and
    the metrics read (`current`, `resume`)."""

    engine: AsyncEngine
    settings: ReputationSettings = field(default_factory=ReputationSettings)
    clock: Callable[[], dt.datetime] = utcnow
    monotonic: Callable[[], float] = time.monotonic
    # Recipient hashes never counted (`uncounted_hashes`: the SES mailbox simulator).
    uncounted: Sequence[str] = ()
    _paused: Mapping[str, str] = field(default_factory=dict, init=False)
    _loaded_at: float | None = field(default=None, init=False)
    _refreshing: asyncio.Task[None] | None = field(default=None, init=False)
    _evaluated_at: float | None = field(default=None, init=False)

    async def verdict(self, identity: str | None, category: str) -> str | None:
        """None when a send of `category` from `identity` may go now, else the reason it
        is deferred. Costs no round trip except when the view is first loaded."""
        if not self.settings.enabled or identity is None:
            return None
        if self._loaded_at is None:
            # The process's first sends wait for one load, together (one statement).
            await asyncio.shield(self._refresh_soon())
        elif self.monotonic() - self._loaded_at >= self.settings.refresh_seconds:
            self._refresh_soon()
        state = self._paused.get(identity)
        if state is None or not blocks(state, category):
            return None
        return deferral_reason(identity, state)

    def _refresh_soon(self) -> asyncio.Task[None]:
        """The refresh under way, or a new one (at most one at a time)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.refresh())
        return self._refreshing

    async def refresh(self) -> None:
        """Load the paused identities now (one statement). A failure keeps the last view
        (logged) and is tried again after the refresh interval."""
        try:
            async with pg_connection(self.engine) as conn:
                self._paused = await paused(conn)
        except Exception:
            log.warning("reputation view not refreshed; keeping the last one", exc_info=True)
        finally:
            self._loaded_at = self.monotonic()

    async def evaluate(self, *, unless_since: dt.datetime | None = None) -> list[Change]:
        """Evaluate every identity now (see `evaluate`) and refresh this process's view."""
        async with pg_connection(self.engine) as conn:
            result = await evaluate(
                conn,
                self.settings,
                now=self.clock(),
                uncounted=self.uncounted,
                unless_since=unless_since,
            )
        self._evaluated_at = self.monotonic()
        if result is None:
            return []
        rows, changes = result
        self._paused = {r.identity: r.state for r in rows if r.state != OK}
        self._loaded_at = self.monotonic()
        return changes

    async def maybe_evaluate(self) -> int:
        """The worker's periodic job: evaluate when GATEWAY_REPUTATION_EVALUATE_SECONDS have
        passed since this process's last try and since any process's last evaluation;
        returns how many identities changed state."""
        if not self.settings.enabled:
            return 0
        last = self._evaluated_at
        interval = self.settings.evaluate_seconds
        if last is not None and self.monotonic() - last < interval:
            return 0
        # A little slack: processes whose sweeps run at the same cadence must not skip each
        # other's turn by a few milliseconds.
        since = self.clock() - dt.timedelta(seconds=interval * 0.9)
        return len(await self.evaluate(unless_since=since))

    async def current(self) -> list[IdentityReputation]:
        """Every identity's state, rates and thresholds as last evaluated (from the database,
        so every process reports the same figures). What the metrics collector publishes."""
        async with pg_connection(self.engine) as conn:
            rows = await states(conn)
        return [report(r, self.settings) for r in rows]

    async def one(self, identity: str) -> IdentityReputation | None:
        """One identity's report, None when it was never evaluated."""
        async with pg_connection(self.engine) as conn:
            row = await state_of(conn, identity)
        return report(row, self.settings) if row is not None else None

    async def resume(self, identity: str, *, actor: str, reason: str) -> IdentityReputation:
        """An operator's resume (see `resume`); this process's view follows at once, the
        others within the refresh interval. Raises UnknownIdentity / NotPaused."""
        async with pg_connection(self.engine) as conn:
            row = await resume(
                conn, identity, self.settings, actor=actor, reason=reason, now=self.clock()
            )
        self._paused = {k: v for k, v in self._paused.items() if k != identity}
        return report(row, self.settings)

    async def close(self) -> None:
        """Wait for a refresh under way (at shutdown)."""
        task = self._refreshing
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
