"""The reputation guard's pure rules (no I/O): identities, rates, levels, decisions."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as hst

from sender.reputation import (
    ALL_PAUSED,
    EMAIL_THRESHOLDS,
    LEVEL,
    MARKETING_PAUSED,
    OK,
    REASON_PREFIX,
    STATE_OF_LEVEL,
    STATES,
    Counts,
    Standing,
    Thresholds,
    blocks,
    decide,
    deferral_reason,
    identity_of,
    level_of,
    rates,
)
from webhooks.events import FeedbackEvent

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
EARLIER = NOW - dt.timedelta(hours=3)


@pytest.mark.parametrize(
    ("channel", "sender", "expected"),
    [
        ("email", "gateway@Example.COM", "example.com"),
        ("email", "Shop <news@Mail.Shop.example>", "mail.shop.example"),
        ("email", "a@b@c.example.", "c.example"),
        ("email", "no-at-sign", None),
        ("email", "", None),
        ("email", None, None),
        ("sms", "+15005550006", "+15005550006"),
        ("sms", " MG0123456789abcdef0123456789abcdef ", "MG0123456789abcdef0123456789abcdef"),
        ("sms", None, None),
    ],
)
def test_identity_of(channel: str, sender: str | None, expected: str | None) -> None:
    assert identity_of(channel, sender) == expected


def test_rates_are_percent_of_sends_and_zero_without_sends() -> None:
    assert rates(Counts(0, 5, 5)) == (0.0, 0.0)
    assert rates(Counts(1000, 40, 1)) == (4.0, 0.1)


T = Thresholds(4.0, 0.08, 8.0, 0.4)


@pytest.mark.parametrize(
    ("counts", "level"),
    [
        # Below the minimum volume nothing applies, whatever the rates.
        (Counts(499, 499, 499), 0),
        (Counts(0, 0, 0), 0),
        # Exactly at a threshold pauses; just under does not.
        (Counts(10_000, 399, 7), 0),
        (Counts(10_000, 400, 0), 1),
        (Counts(10_000, 0, 8), 1),
        (Counts(10_000, 799, 39), 1),
        (Counts(10_000, 800, 0), 2),
        (Counts(10_000, 0, 40), 2),
        (Counts(500, 20, 0), 1),
        (Counts(500, 40, 0), 2),
        # Either rate alone decides; the higher level wins.
        (Counts(10_000, 450, 45), 2),
        (Counts(10_000, 900, 1), 2),
    ],
)
def test_level_of(counts: Counts, level: int) -> None:
    assert level_of(counts, T, 500) == level


def test_default_email_thresholds_are_under_the_ses_review_levels() -> None:
    # SES reviews at 5 % / 0.1 % and may pause at 10 % / 0.5 % (PROVIDERS.md, SES-ENF).
    assert EMAIL_THRESHOLDS.first_marketing < 5.0 and EMAIL_THRESHOLDS.second_marketing < 0.1
    assert EMAIL_THRESHOLDS.first_all < 10.0 and EMAIL_THRESHOLDS.second_all < 0.5


@given(
    sends=hst.integers(0, 5000),
    bounces=hst.integers(0, 5000),
    complaints=hst.integers(0, 5000),
    more=hst.integers(0, 500),
)
def test_more_bounces_or_complaints_never_lower_the_level(
    sends: int, bounces: int, complaints: int, more: int
) -> None:
    base = level_of(Counts(sends, bounces, complaints), T, 500)
    assert level_of(Counts(sends, bounces + more, complaints), T, 500) >= base
    assert level_of(Counts(sends, bounces, complaints + more), T, 500) >= base


def test_states_and_levels_correspond() -> None:
    assert [LEVEL[s] for s in STATES] == [0, 1, 2]
    assert {STATE_OF_LEVEL[LEVEL[s]] for s in STATES} == set(STATES)


@pytest.mark.parametrize(
    ("state", "category", "blocked"),
    [
        (OK, "marketing", False),
        (OK, "transactional", False),
        (MARKETING_PAUSED, "marketing", True),
        (MARKETING_PAUSED, "transactional", False),
        (ALL_PAUSED, "marketing", True),
        (ALL_PAUSED, "transactional", True),
        (None, "marketing", False),
    ],
)
def test_blocks(state: str | None, category: str, blocked: bool) -> None:
    assert blocks(state, category) is blocked


def test_deferral_reason_names_the_identity_and_what_is_paused() -> None:
    marketing = deferral_reason("example.com", MARKETING_PAUSED)
    assert marketing.startswith(REASON_PREFIX) and "marketing sends of example.com" in marketing
    assert "all sends of +15005550006" in deferral_reason("+15005550006", ALL_PAUSED)


_HOLD_UNTIL = (None, NOW - dt.timedelta(seconds=1), NOW, NOW + dt.timedelta(hours=1))


@pytest.mark.parametrize(
    ("level", "state", "hold_level", "hold_until"),
    list(itertools.product((0, 1, 2), STATES, (0, 1, 2), _HOLD_UNTIL)),
)
def test_decide_every_combination(
    level: int, state: str, hold_level: int, hold_until: dt.datetime | None
) -> None:
    previous = Standing(state, EARLIER, hold_level, hold_until)
    new = decide(level, previous, NOW)
    hold_active = hold_level > 0 and hold_until is not None and NOW < hold_until
    if hold_active and level > 0:
        # The operator's hold stands: pauses up to its level are not applied...
        assert (new.hold_level, new.hold_until) == (hold_level, hold_until)
        expected = OK if level <= hold_level else STATE_OF_LEVEL[level]
    else:
        # ...and ends when it expires or the rates fall back (the next crossing pauses).
        assert (new.hold_level, new.hold_until) == (0, None)
        expected = STATE_OF_LEVEL[level]
    assert new.state == expected
    # `since` moves only when the state changes.
    assert new.since == (EARLIER if new.state == state else NOW)


@pytest.mark.parametrize("level", [0, 1, 2])
def test_decide_for_a_new_identity(level: int) -> None:
    new = decide(level, None, NOW)
    assert (new.state, new.since, new.hold_level) == (STATE_OF_LEVEL[level], NOW, 0)


def test_resume_then_fall_back_then_cross_again_pauses() -> None:
    # Resumed while at level 1: the hold keeps it ok at level 1...
    held = Standing(OK, NOW, 1, NOW + dt.timedelta(hours=24))
    assert decide(1, held, NOW).state == OK
    # ...the rates fall back: the hold ends...
    cleared = decide(0, held, NOW + dt.timedelta(minutes=1))
    assert cleared.hold_level == 0 and cleared.state == OK
    # ...and the next crossing pauses at once.
    assert decide(1, cleared, NOW + dt.timedelta(minutes=2)).state == MARKETING_PAUSED


@pytest.mark.parametrize(
    ("details", "code"),
    [
        ({"bounce_type": "Permanent", "bounce_subtype": "OnAccountSuppressionList"}, None),
        ({"complaint_subtype": "OnAccountSuppressionList", "feedback_type": "abuse"}, None),
        ({"bounce_type": "Permanent", "bounce_subtype": "General", "status": "5.1.1"}, "5.1.1"),
        ({"bounce_type": "Permanent", "bounce_subtype": "Suppressed"}, None),
        ({"error_code": "21610"}, "21610"),
    ],
)
def test_ses_own_suppressions_are_marked_on_the_event(
    details: dict[str, str], code: str | None
) -> None:
    """The attempt of a bounce/complaint SES made for its own suppression list gets that
    subtype as its error code, which the guard's count leaves out (SES does too)."""
    event = FeedbackEvent("ses", "e1", "bounce", "email", details=details)
    suppressed = "OnAccountSuppressionList" in details.values()
    assert event.error_code == ("OnAccountSuppressionList" if suppressed else code)
