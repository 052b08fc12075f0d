"""GATEWAY_REPUTATION_* and GATEWAY_STALE_REPORT_HOURS are read and validated at start."""

from __future__ import annotations

import pytest

from gateway.settings import SettingsError, load_settings
from sender.reputation import Thresholds


def test_defaults() -> None:
    s = load_settings({})
    r = s.reputation
    assert (r.enabled, r.window_hours, r.min_sends, r.resume_hours) == (True, 24.0, 500, 24.0)
    assert r.email == Thresholds(4.0, 0.08, 8.0, 0.4)
    assert r.sms == Thresholds(10.0, 1.0, 20.0, 3.0)
    assert (r.evaluate_seconds, r.refresh_seconds) == (60.0, 5.0)
    assert s.stale_report_hours == 72.0


def test_every_setting_is_read() -> None:
    s = load_settings(
        {
            "GATEWAY_REPUTATION_ENABLED": "false",
            "GATEWAY_REPUTATION_WINDOW_HOURS": "12",
            "GATEWAY_REPUTATION_MIN_SENDS": "1000",
            "GATEWAY_REPUTATION_BOUNCE_PERCENT": "3",
            "GATEWAY_REPUTATION_COMPLAINT_PERCENT": "0.05",
            "GATEWAY_REPUTATION_BOUNCE_PAUSE_ALL_PERCENT": "6",
            "GATEWAY_REPUTATION_COMPLAINT_PAUSE_ALL_PERCENT": "0.3",
            "GATEWAY_REPUTATION_SMS_FAILURE_PERCENT": "5",
            "GATEWAY_REPUTATION_SMS_OPT_OUT_PERCENT": "0.5",
            "GATEWAY_REPUTATION_SMS_FAILURE_PAUSE_ALL_PERCENT": "15",
            "GATEWAY_REPUTATION_SMS_OPT_OUT_PAUSE_ALL_PERCENT": "2",
            "GATEWAY_REPUTATION_EVALUATE_SECONDS": "30",
            "GATEWAY_REPUTATION_REFRESH_SECONDS": "2",
            "GATEWAY_REPUTATION_RESUME_HOURS": "4",
            "GATEWAY_STALE_REPORT_HOURS": "48",
        }
    )
    r = s.reputation
    assert (r.enabled, r.window_hours, r.min_sends, r.resume_hours) == (False, 12.0, 1000, 4.0)
    assert r.email == Thresholds(3.0, 0.05, 6.0, 0.3)
    assert r.sms == Thresholds(5.0, 0.5, 15.0, 2.0)
    assert (r.evaluate_seconds, r.refresh_seconds) == (30.0, 2.0)
    assert s.stale_report_hours == 48.0


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"GATEWAY_REPUTATION_BOUNCE_PERCENT": "0"}, "GATEWAY_REPUTATION_BOUNCE_PERCENT"),
        ({"GATEWAY_REPUTATION_BOUNCE_PERCENT": "101"}, "GATEWAY_REPUTATION_BOUNCE_PERCENT"),
        ({"GATEWAY_REPUTATION_COMPLAINT_PERCENT": "x"}, "GATEWAY_REPUTATION_COMPLAINT_PERCENT"),
        # The pause-all level below the marketing one.
        (
            {"GATEWAY_REPUTATION_BOUNCE_PERCENT": "9"},
            "GATEWAY_REPUTATION_BOUNCE_PAUSE_ALL_PERCENT",
        ),
        (
            {"GATEWAY_REPUTATION_SMS_OPT_OUT_PAUSE_ALL_PERCENT": "0.5"},
            "GATEWAY_REPUTATION_SMS_OPT_OUT_PAUSE_ALL_PERCENT",
        ),
        ({"GATEWAY_REPUTATION_MIN_SENDS": "0"}, "GATEWAY_REPUTATION_MIN_SENDS"),
        ({"GATEWAY_REPUTATION_WINDOW_HOURS": "0"}, "GATEWAY_REPUTATION_WINDOW_HOURS"),
        ({"GATEWAY_REPUTATION_ENABLED": "maybe"}, "GATEWAY_REPUTATION_ENABLED"),
        ({"GATEWAY_STALE_REPORT_HOURS": "-1"}, "GATEWAY_STALE_REPORT_HOURS"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(env)
    assert err.value.name == name
