"""Pure parts of the console: what a raw payload hides, the session cookie, the SVG chart."""

from __future__ import annotations

import datetime as dt
import uuid

from gateway.console import session
from gateway.console.charts import Series, stacked_days
from gateway.console.routes import HIDDEN, shown


def test_signatures_capabilities_and_derived_keys_are_not_shown() -> None:
    derived = "a" * 64
    payload = {
        "Type": "Notification",
        "Signature": "c2lnbmF0dXJl",
        "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&x=1",
        "Message": {
            "mail": {
                "tags": {"derived_key": [derived], "delivery_id": ["d-1"]},
                "headers": [
                    {"name": "X-Gateway-Delivery", "value": derived},
                    {"name": "List-Unsubscribe", "value": "<https://gw.example/u/opaque>"},
                    {"name": "Subject", "value": "Hello"},
                ],
            },
            "note": f"ref {derived} inside text",
        },
    }
    out = shown(payload, frozenset({derived}))
    assert out["Signature"] == HIDDEN and out["UnsubscribeURL"] == HIDDEN
    mail = out["Message"]["mail"]
    assert mail["tags"]["derived_key"] == HIDDEN and mail["tags"]["delivery_id"] == ["d-1"]
    assert [h["value"] for h in mail["headers"]] == [HIDDEN, HIDDEN, "Hello"]
    assert out["Message"]["note"] == HIDDEN
    assert derived not in repr(out) and "opaque" not in repr(out)
    assert out["Type"] == "Notification"


def test_a_session_cookie_round_trips_and_rejects_tampering() -> None:
    key = session.signing_key(b"k" * 32)
    s = session.new_session(uuid.uuid4(), now=1000)
    value = session.encode(key, s)
    assert session.decode(key, value, now=1001) == s
    assert session.decode(key, value, now=1000 + session.SESSION_SECONDS) is None
    payload, mac = value.split(".")
    assert session.decode(key, payload + "x." + mac, now=1001) is None
    assert session.decode(session.signing_key(b"j" * 32), value, now=1001) is None
    assert session.decode(key, "garbage", now=1001) is None
    assert s.key_id.hex in __import__("base64").urlsafe_b64decode(payload + "==").decode()
    token = session.csrf_token(key, s)
    assert session.csrf_ok(key, s, token)
    assert not session.csrf_ok(key, s, token[:-1] + ("A" if token[-1] != "A" else "B"))
    assert not session.csrf_ok(key, session.new_session(s.key_id), token)


def test_the_chart_escapes_its_text_and_scales_to_the_peak() -> None:
    days = [dt.date(2026, 1, 1), dt.date(2026, 1, 2)]
    svg = stacked_days(
        "<b>x</b>", days, [Series("a&b", "s-ok", [2, 0]), Series("c", "s-bad", [2, 0])]
    )
    assert "<b>" not in svg and "&lt;b&gt;" in svg and "a&amp;b" in svg
    assert svg.count("<rect") == 2
    assert ">4</text>" in svg  # the y axis is labelled with the highest total
    assert "2026-01-02: none" in svg and "2026-01-01: 2 a&amp;b, 2 c" in svg
