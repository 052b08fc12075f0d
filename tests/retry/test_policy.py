"""Backoff policy (pure): bounds, jitter, cap, deadline, Retry-After floor, attempts, overrides."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from gateway.settings import SettingsError, load_settings
from retry.policy import (
    Action,
    Backoff,
    Failure,
    backoff_for,
    backoff_from_settings,
    ceiling_seconds,
    decide,
    delay_seconds,
    next_attempt_at,
    settle_reason,
)
from retry.settings import (
    PolicyOverride,
    RateSpec,
    RetrySettings,
    parse_policies,
    parse_rate_limits,
)
from tests.retry.helpers import MaxRng

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

backoffs = st.builds(
    Backoff,
    base_seconds=st.floats(0.0, 100.0),
    max_seconds=st.floats(0.0, 10_000.0),
    max_attempts=st.integers(1, 50),
)


class MinRng(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


def test_ceiling_doubles_from_base_until_the_cap() -> None:
    b = Backoff(base_seconds=2.0, max_seconds=600.0, max_attempts=6)
    assert [ceiling_seconds(b, n) for n in range(0, 11)] == [
        2.0,
        2.0,
        4.0,
        8.0,
        16.0,
        32.0,
        64.0,
        128.0,
        256.0,
        512.0,
        600.0,
    ]


@given(backoffs, st.integers(0, 100_000), st.integers(0, 2**32))
@hypothesis_settings(deadline=None)  # pure code; no per-example time limit on a busy machine
def test_delay_is_within_zero_and_the_ceiling(b: Backoff, n: int, seed: int) -> None:
    delay = delay_seconds(b, n, rng=random.Random(seed))
    ceiling = ceiling_seconds(b, n)
    assert 0.0 <= delay <= ceiling <= b.max_seconds
    assert ceiling == min(b.max_seconds, b.base_seconds * 2.0 ** min(max(n - 1, 0), 1023))


def test_jitter_is_full_range() -> None:
    b = Backoff(base_seconds=1.0, max_seconds=100.0, max_attempts=10)
    rng = random.Random(7)
    samples = [delay_seconds(b, 4, rng=rng) for _ in range(2000)]
    # full jitter: spread over [0, 8], not clustered at the top (as "equal jitter" would be)
    assert min(samples) < 0.1 and max(samples) > 7.9
    assert 3.5 < sum(samples) / len(samples) < 4.5
    assert delay_seconds(b, 4, rng=MaxRng()) == 8.0
    assert delay_seconds(b, 4, rng=MinRng()) == 0.0


@given(backoffs, st.integers(0, 60), st.floats(0.0, 50_000.0))
@hypothesis_settings(deadline=None)  # pure code; no per-example time limit on a busy machine
def test_retry_after_is_a_floor_even_above_the_cap(b: Backoff, n: int, retry_after: float) -> None:
    delay = delay_seconds(b, n, rng=MinRng(), retry_after=retry_after)
    assert delay == retry_after
    assert delay_seconds(b, n, rng=MaxRng(), retry_after=retry_after) == max(
        retry_after, ceiling_seconds(b, n)
    )


@given(backoffs, st.integers(0, 60))
@hypothesis_settings(deadline=None)  # pure code; no per-example time limit on a busy machine
def test_no_next_attempt_once_the_budget_is_spent(b: Backoff, made: int) -> None:
    at = next_attempt_at(b, made, NOW, rng=MaxRng())
    if made >= b.max_attempts:
        assert at is None
    else:
        assert at == NOW + dt.timedelta(seconds=ceiling_seconds(b, made))


@given(
    backoffs,
    st.integers(0, 10),
    st.integers(0, 2**32),
    st.floats(-100.0, 10_000.0),
    st.none() | st.floats(0.0, 20_000.0),
)
@hypothesis_settings(deadline=None)  # pure code; no per-example time limit on a busy machine
def test_the_deadline_bounds_every_retry(
    b: Backoff, made: int, seed: int, deadline_in: float, retry_after: float | None
) -> None:
    expires = NOW + dt.timedelta(seconds=deadline_in)
    rng = random.Random(seed)
    at = next_attempt_at(b, made, NOW, expires_at=expires, rng=rng, retry_after=retry_after)
    if at is not None:
        assert NOW <= at < expires
        assert made < b.max_attempts
        if retry_after is not None:
            assert at >= NOW + dt.timedelta(seconds=retry_after)


def test_an_otp_past_its_deadline_gets_no_retry() -> None:
    b = Backoff(base_seconds=2.0, max_seconds=600.0, max_attempts=6)
    five_minutes = NOW + dt.timedelta(minutes=5)
    assert next_attempt_at(b, 1, NOW, expires_at=five_minutes, rng=MaxRng()) == NOW + dt.timedelta(
        seconds=2
    )
    # the 9th ceiling (512 s) would land after the deadline
    assert (
        next_attempt_at(Backoff(2.0, 600.0, 20), 9, NOW, expires_at=five_minutes, rng=MaxRng())
        is None
    )
    # Retry-After beyond the deadline: give up rather than send a stale code
    assert next_attempt_at(b, 1, NOW, expires_at=five_minutes, retry_after=301.0) is None
    assert next_attempt_at(b, 1, five_minutes, expires_at=five_minutes, rng=MinRng()) is None


def test_most_specific_override_wins_per_value() -> None:
    defaults = Backoff(2.0, 600.0, 6)
    overrides = {
        "sms.high": PolicyOverride(base_seconds=0.5),
        "sms": PolicyOverride(max_seconds=30.0, max_attempts=4),
        "high": PolicyOverride(base_seconds=1.0, max_attempts=3),
        "low": PolicyOverride(max_attempts=2),
    }
    assert backoff_for(defaults, overrides, "sms", "high") == Backoff(0.5, 30.0, 4)
    assert backoff_for(defaults, overrides, "email", "high") == Backoff(1.0, 600.0, 3)
    assert backoff_for(defaults, overrides, "sms", "low") == Backoff(2.0, 30.0, 4)
    assert backoff_for(defaults, overrides, "email", "low") == Backoff(2.0, 600.0, 2)
    assert backoff_for(defaults, overrides, "email", "normal") == defaults
    settings = RetrySettings(base_seconds=0.25, max_seconds=5.0, max_attempts=3, policies=overrides)
    assert backoff_from_settings(settings, "email", "normal") == Backoff(0.25, 5.0, 3)


def test_policy_and_rate_limit_syntax() -> None:
    assert parse_policies(" sms.high=1/30/4 , email=//3,LOW=0.5//") == {
        "sms.high": PolicyOverride(1.0, 30.0, 4),
        "email": PolicyOverride(None, None, 3),
        "low": PolicyOverride(0.5, None, None),
    }
    for bad in ("sms.urgent=1/2/3", "fax=1/2/3", "sms=1/2", "sms=a/b/c", "sms=1/2/0", "sms"):
        with pytest.raises(ValueError):
            parse_policies(bad)
    assert parse_rate_limits("ses=14,twilio:*=1,twilio:+15551234567=2/5") == {
        "ses": RateSpec(14.0),
        "twilio:*": RateSpec(1.0),
        "twilio:+15551234567": RateSpec(2.0, 5.0),
    }
    for bad in ("ses", "ses=0", "ses=-1", "ses=x", "ses=1/0.5", "=3"):
        with pytest.raises(ValueError):
            parse_rate_limits(bad)


def test_settings_from_the_environment() -> None:
    s = load_settings(
        {
            "GATEWAY_RETRY_BASE_SECONDS": "0.05",
            "GATEWAY_RETRY_MAX_SECONDS": "0.5",
            "GATEWAY_RETRY_MAX_ATTEMPTS": "3",
            "GATEWAY_RETRY_POLICIES": "sms.high=0.01//5",
            "GATEWAY_RATE_LIMITS": "ses=2/4",
            "GATEWAY_RATE_LOW_SHARE": "0.5",
            "GATEWAY_UNKNOWN_OUTCOME_MARKETING": "retry",
            "GATEWAY_BREAKER_FAILURE_RATIO": "0.25",
            "GATEWAY_BREAKER_MIN_VOLUME": "5",
            "GATEWAY_BREAKER_COOLDOWN_SECONDS": "1.5",
            "GATEWAY_WORKER_CONCURRENCY": "3",
        }
    ).retry
    assert backoff_from_settings(s, "sms", "high") == Backoff(0.01, 0.5, 5)
    assert s.rate_limits == {"ses": RateSpec(2.0, 4.0)} and s.low_priority_share == 0.5
    assert s.unknown_outcome_marketing == "retry" and s.worker_concurrency == 3
    assert (s.breaker_failure_ratio, s.breaker_min_volume, s.breaker_cooldown_seconds) == (
        0.25,
        5,
        1.5,
    )
    defaults = load_settings({}).retry
    assert defaults.rate_limits == {"ses": RateSpec(14.0), "twilio:*": RateSpec(1.0)}
    assert (
        defaults.low_priority_share == 0.6 and defaults.unknown_outcome_marketing == "dead_letter"
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GATEWAY_RETRY_POLICIES", "sms.urgent=1/2/3"),
        ("GATEWAY_RATE_LIMITS", "ses=fast"),
        ("GATEWAY_RATE_LOW_SHARE", "1.5"),
        ("GATEWAY_RATE_LOW_SHARE", "0"),
        ("GATEWAY_UNKNOWN_OUTCOME_MARKETING", "maybe"),
        ("GATEWAY_BREAKER_FAILURE_RATIO", "2"),
        ("GATEWAY_BREAKER_MIN_VOLUME", "0"),
    ],
)
def test_bad_retry_settings_name_their_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings({name: value})
    assert err.value.name == name


# -- recipient refusals and the maximum deferral age (issue 11, defect 2) --------------------


def test_a_recipient_refusal_retries_within_the_budget_then_fails() -> None:
    backoff = Backoff(1.0, 10.0, 3)
    settings = RetrySettings()
    again = decide(
        Failure.RECIPIENT,
        backoff=backoff,
        attempts_made=1,
        now=NOW,
        expires_at=None,
        settings=settings,
        rng=MaxRng(),
    )
    assert again.action is Action.RETRY and again.at is not None
    done = decide(
        Failure.RECIPIENT,
        backoff=backoff,
        attempts_made=3,
        now=NOW,
        expires_at=None,
        settings=settings,
    )
    assert (done.action, done.dead_reason) == (Action.FAIL, "max_attempts")
    late = decide(
        Failure.RECIPIENT,
        backoff=backoff,
        attempts_made=1,
        now=NOW,
        expires_at=NOW + dt.timedelta(seconds=0.5),
        settings=settings,
        rng=MaxRng(),
    )
    assert (late.action, late.dead_reason) == (Action.FAIL, "expired")


@pytest.mark.parametrize(
    ("waited", "held", "expected"),
    [
        (3599.0, False, None),
        (3600.0, False, "max_deferral"),
        (10**6, True, None),  # held to the attempt budget instead
    ],
)
def test_a_deferral_without_a_deadline_ends_at_the_maximum_deferral_age(
    waited: float, held: bool, expected: str | None
) -> None:
    reason = settle_reason(
        backoff=Backoff(1.0, 10.0, 3),
        attempts_made=0,
        now=NOW,
        expires_at=None,
        settings=RetrySettings(max_deferral_seconds=3600.0),
        outcome_unknown=False,
        transactional=True,
        held_to_budget=held,
        deferred_since=NOW - dt.timedelta(seconds=waited),
    )
    assert reason == expected


def test_the_maximum_deferral_age_setting() -> None:
    assert load_settings({}).retry.max_deferral_seconds == 86400.0
    env = {"GATEWAY_RETRY_MAX_DEFERRAL_SECONDS": "90"}
    assert load_settings(env).retry.max_deferral_seconds == 90.0
    with pytest.raises(SettingsError, match="GATEWAY_RETRY_MAX_DEFERRAL_SECONDS"):
        load_settings({"GATEWAY_RETRY_MAX_DEFERRAL_SECONDS": "0"})
