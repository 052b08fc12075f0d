"""Smoke test of the bench runner's pure helpers (formatting and verdicts, no measuring)."""

from __future__ import annotations

from benchmarks.load import LoadSpec, lua_script, raw_request, render
from benchmarks.report import Row, fmt_number, median, table, target_text


def test_ratio_and_verdicts() -> None:
    row = Row("send", 500.0, "req/s", floor=1000.0, floor_name="send floor", target=(">=", 0.4))
    assert row.ratio == 0.5
    assert row.verdict == "pass"
    assert target_text(row) == ">= 40 % of send floor"
    assert Row("p50", 4.0, "ms", target=("<=", 3.0)).verdict == "FAIL"
    assert Row("x", None, "x").verdict == "n/a"
    assert Row("x", 1.0, "x").verdict == ""
    assert target_text(Row("r", 16.0, "x", target=(">=", 15))) == ">= 15 x"
    assert target_text(Row("i", 1.0, "rows/s", target=(">=", 10_000))) == ">= 10,000 rows/s"


def test_median_skips_unknown_values() -> None:
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None]) is None


def test_table_has_a_line_per_row() -> None:
    rows = [
        Row("insert floor", 3093.4, "req/s"),
        Row("callback", 1600.0, "req/s", 3093.4, "insert floor", (">=", 0.5)),
    ]
    lines = table(rows).splitlines()
    assert len(lines) == 4
    assert "3,093" in lines[2]
    assert "0.52" in lines[3] and "pass" in lines[3]
    assert fmt_number(0.0123) == "0.0123"
    assert fmt_number(None) == "n/a"


def test_request_rendering() -> None:
    assert render('{"k": "@U@", "to": "+1415555@P@"}', "a-1", 12345) == (
        '{"k": "a-1", "to": "+14155552345"}'
    )
    raw = raw_request("http://127.0.0.1:8000", "POST", "/x", {"A": "b"}, b"{}")
    assert raw.startswith(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 2\r\n")
    assert raw.endswith(b"\r\n\r\n{}")
    script = lua_script(LoadSpec(base="http://h", body="@U@"), threads=2)
    assert "function request()" in script and "WRKJSON" in script


def test_rows_survive_a_results_file() -> None:
    row = Row("send", 500.0, "req/s", 1000.0, "send floor", (">=", 0.4), [1.0, 2.0], "n")
    again = Row.from_dict(row.as_dict())
    assert again == row
    assert again.verdict == "pass"
