"""Import parsing (every supported layout, bad rows, chunk boundaries) and export lines."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from suppression.formats import (
    MAX_RECORD_BYTES,
    SOFT_BOUNCE_TTL,
    ImportOptions,
    ImportRecord,
    InvalidRecord,
    UnrecognizedFormat,
    export_header,
    export_line,
    parse_import,
    redact,
)

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def parse(data: bytes | str, *, chunk: int = 1 << 16, **options: Any) -> list[Any]:
    raw = data.encode() if isinstance(data, str) else data
    return [r async for r in parse_import(_chunks(raw, chunk), ImportOptions(**options), now=NOW)]


def summary(records: list[Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for r in records:
        if isinstance(r, InvalidRecord):
            out.append((r.line, "invalid"))
        else:
            out.append((r.line, r.address.channel, r.address.key, r.reason, r.scope))
    return out


def errors(records: list[Any]) -> dict[int, str]:
    return {r.line: r.error for r in records if isinstance(r, InvalidRecord)}


GATEWAY_CSV = (
    "\ufeffid,channel,address,scope,reason,source_type,created_at,expires_at\r\n"
    "1,email,Ann@Example.com,all,hard_bounce,provider_event,2026-01-01T00:00:00+00:00,\r\n"
    "2,sms,(202) 555-0143,all,sms_stop,provider_event,,\r\n"
    "3,email,not-an-address,all,manual,operator,,\r\n"
    "4,email,b@example.com,all,bogus,operator,,\r\n"
    "5,email,c@example.com,newsletter,complaint,operator,,\r\n"
    "6,email,,all,manual,operator,,\r\n"
    "7,fax,d@example.com,all,manual,operator,,\r\n"
    "8,email,e@example.com,all,soft_bounce,operator,,tomorrow\r\n"
    '9,email,"f@example.com",news,unsubscribe,"multi\r\nline note",,\r\n'
    "10,email,g@example.com,all,manual,operator,,,extra,fields\r\n"
    '11,email,"broken"quote@example.com,all,manual,operator,,\r\n'
    "\r\n"
    "12,email,h@example.com,marketing,unsubscribe,operator,,2030-01-01T00:00:00+00:00\r\n"
)


async def test_gateway_csv_with_bad_rows() -> None:
    records = await parse(GATEWAY_CSV)
    assert summary(records) == [
        (2, "email", "ann@example.com", "hard_bounce", "all"),
        (3, "sms", "+12025550143", "sms_stop", "all"),
        (4, "invalid"),
        (5, "invalid"),
        (6, "invalid"),
        (7, "invalid"),
        (8, "invalid"),
        (9, "invalid"),
        (10, "email", "f@example.com", "unsubscribe", "news"),
        (12, "invalid"),
        (13, "invalid"),
        (15, "email", "h@example.com", "unsubscribe", "marketing"),
    ]
    errs = errors(records)
    assert errs[4].startswith("invalid address:") and "not-an-address" not in errs[4]
    assert "unknown reason" in errs[5]
    assert "whole channel" in errs[6]
    assert "erased" in errs[7]
    assert "unknown channel" in errs[8]
    assert "ISO 8601" in errs[9]
    assert "fields" in errs[12]
    assert "malformed CSV" in errs[13]
    last = records[-1]
    assert isinstance(last, ImportRecord)
    assert last.expires_at == dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert records[0].evidence == {
        "import_format": "gateway",
        "original_created_at": "2026-01-01T00:00:00+00:00",
        "original_source_type": "provider_event",
    }


@pytest.mark.parametrize("chunk", [1, 3, 17, 1 << 16])
async def test_chunk_boundaries_do_not_matter(chunk: int) -> None:
    assert summary(await parse(GATEWAY_CSV, chunk=chunk)) == summary(await parse(GATEWAY_CSV))


async def test_gateway_jsonl_with_bad_lines() -> None:
    data = "\n".join(
        [
            json.dumps({"channel": "email", "address": "a@example.com", "reason": "manual"}),
            "{not json",
            "[1, 2]",
            json.dumps({"channel": "email", "address": "b@example.com"}),
            json.dumps({"channel": "email", "address": 5, "reason": "manual"}),
            "",
            json.dumps({"foo": "bar"}),
            json.dumps(
                {
                    "channel": "sms",
                    "address": "+442071838750",
                    "reason": "sms_stop",
                    "scope": "all",
                    "history": [{"action": "add"}],
                }
            ),
        ]
    )
    records = await parse(data)
    assert summary(records) == [
        (1, "email", "a@example.com", "manual", "all"),
        (2, "invalid"),
        (3, "invalid"),
        (4, "invalid"),
        (5, "invalid"),
        (7, "invalid"),
        (8, "sms", "+442071838750", "sms_stop", "all"),
    ]
    assert "missing reason" in errors(records)[4]
    assert "unrecognized record" in errors(records)[7]


async def test_ses_formats() -> None:
    # SuppressedDestinationSummary fields as CSV columns
    summaries = (
        "EmailAddress,Reason,LastUpdateTime\n"
        "bounce@example.com,BOUNCE,2026-04-01T10:00:00+00:00\n"
        "complaint@example.com,COMPLAINT,1711965600\n"
        "x@example.com,UNSUBSCRIBED,\n"
        "bad-address,BOUNCE,\n"
    )
    records = await parse(summaries)
    assert summary(records) == [
        (2, "email", "bounce@example.com", "hard_bounce", "all"),
        (3, "email", "complaint@example.com", "complaint", "all"),
        (4, "invalid"),
        (5, "invalid"),
    ]
    assert records[1].evidence == {
        "import_format": "ses",
        "ses_reason": "COMPLAINT",
        "original_time": "2024-04-01T10:00:00+00:00",
    }
    # the SES bulk-import layout: no header, optional blank after the comma
    bulk = "recipient1@example.com,BOUNCE\nrecipient2@example.com, COMPLAINT\nlonely@example.com\n"
    assert summary(await parse(bulk)) == [
        (1, "email", "recipient1@example.com", "hard_bounce", "all"),
        (2, "email", "recipient2@example.com", "complaint", "all"),
        (3, "invalid"),
    ]
    # JSON: API summaries (LastUpdateTime in Unix seconds) and the bulk-import objects
    jsonl = (
        '{"EmailAddress": "a@example.com", "Reason": "BOUNCE", "LastUpdateTime": 1711965600.5}\n'
        '{"emailAddress": "b@example.com", "reason": "COMPLAINT"}\n'
        '{"emailAddress": "c@example.com", "reason": "OTHER"}\n'
    )
    assert summary(await parse(jsonl)) == [
        (1, "email", "a@example.com", "hard_bounce", "all"),
        (2, "email", "b@example.com", "complaint", "all"),
        (3, "invalid"),
    ]


async def test_sendgrid_exports() -> None:
    bounces = (
        "email,created,reason,status\n"
        'gone@example.com,1711965600,"550 5.1.1 <gone@example.com>: Recipient address rejected"'
        ",5.1.1\n"
        "full@example.com,2024-04-01 10:00:00,452 4.2.2 Mailbox full,4.2.2\n"
        "@example.com,1711965600,bad,5.0.0\n"
    )
    records = await parse(bounces)
    assert summary(records) == [
        (2, "email", "gone@example.com", "hard_bounce", "all"),
        (3, "email", "full@example.com", "soft_bounce", "all"),
        (4, "invalid"),
    ]
    gone, full = records[0], records[1]
    assert gone.evidence["diagnostic"] == "550 5.1.1 <[address]>: Recipient address rejected"
    assert (
        gone.evidence["import_format"] == "sendgrid:bounces" and gone.evidence["status"] == "5.1.1"
    )
    assert "gone@example.com" not in json.dumps(gone.evidence)
    assert gone.expires_at is None and full.expires_at == NOW + SOFT_BOUNCE_TTL

    spam = "email,created,ip\nspam@example.com,1711965600,192.0.2.1\n"
    assert summary(await parse(spam)) == [(2, "email", "spam@example.com", "complaint", "all")]
    invalid = "email,created,reason\nodd@example.com,1711965600,Known bad domain\n"
    assert summary(await parse(invalid)) == [
        (2, "email", "odd@example.com", "invalid_address", "all")
    ]
    unsubs = "email,created\nu@example.com,1711965600\n"
    assert summary(await parse(unsubs)) == [
        (2, "email", "u@example.com", "unsubscribe", "marketing")
    ]
    assert summary(await parse(unsubs, unsubscribe_scope="news")) == [
        (2, "email", "u@example.com", "unsubscribe", "news")
    ]
    # blocks have the columns of bounces; say which list it is
    blocks = "email,created,reason,status\nblk@example.com,1711965600,554 policy,5.7.1\n"
    (record,) = await parse(blocks, sendgrid_list="blocks")
    assert (record.reason, record.expires_at) == ("soft_bounce", NOW + SOFT_BOUNCE_TTL)
    # JSON objects from the SendGrid API work too
    (record,) = await parse(
        '{"email": "j@example.com", "created": 1711965600, "ip": "192.0.2.1"}\n'
    )
    assert record.reason == "complaint"


async def test_unrecognized_or_mismatched_files_fail_before_any_row() -> None:
    for data, options in [
        ("name,phone\nx,y\n", {}),
        ("just some text\n", {}),
        ("email,created\nu@example.com,1\n", {"format": "ses"}),
        ("EmailAddress,Reason\na@example.com,BOUNCE\n", {"format": "sendgrid"}),
        ("channel,address\nemail,a@example.com\n", {}),
        ('"unterminated\n' + "x" * (MAX_RECORD_BYTES + 10) + "\n", {}),
    ]:
        with pytest.raises(UnrecognizedFormat):
            await parse(data, **options)
    assert await parse("") == [] and await parse("\n\n  \n") == []
    with pytest.raises(ValueError):
        ImportOptions(format="excel")
    with pytest.raises(ValueError):
        ImportOptions(unsubscribe_scope="bad scope!")


async def test_overlong_lines_are_skipped_and_the_rest_is_read() -> None:
    long_line = "email,x@example.com," + "x" * (MAX_RECORD_BYTES * 3) + "\n"
    data = "channel,address,reason\n" + long_line + "email,ok@example.com,manual\n"
    for chunk in (1000, 1 << 16):
        records = await parse(data, chunk=chunk)
        assert summary(records) == [(2, "invalid"), (3, "email", "ok@example.com", "manual", "all")]
    ok = '{"channel":"email","address":"ok@example.com","reason":"manual"}\n'
    jsonl = ok + '{"channel":"email","address":"' + "y" * (MAX_RECORD_BYTES * 2) + '"}\n' + ok
    assert summary(await parse(jsonl, chunk=4096)) == [
        (1, "email", "ok@example.com", "manual", "all"),
        (2, "invalid"),
        (3, "email", "ok@example.com", "manual", "all"),
    ]


def test_redact_removes_every_email_like_token() -> None:
    text = "550 <A.B+tag@Example.COM> and c@d.example; status 5.1.1 (+1 202 555 0143)"
    assert redact(text) == "550 <[address]> and [address]; status 5.1.1 (+1 202 555 0143)"


def test_export_lines_round_trip_through_csv_and_json() -> None:
    item = {
        "id": "5b9c1d8e-0000-4000-8000-000000000001",
        "channel": "email",
        "address": 'odd,"quoted"@example.com',
        "scope": "all",
        "reason": "complaint",
        "active": True,
        "source_type": "provider_event",
        "source_id": "evt-1",
        "evidence": {"feedback": "abuse"},
        "created_at": "2026-01-01T00:00:00+00:00",
        "expires_at": None,
        "history": [{"action": "add", "at": "2026-01-01T00:00:00+00:00"}],
    }
    text = (export_header("csv") + export_line("csv", item)).decode()
    (row,) = list(csv.DictReader(io.StringIO(text)))
    assert row["address"] == item["address"] and row["active"] == "true" and row["expires_at"] == ""
    assert json.loads(row["history"]) == item["history"]
    assert json.loads(export_line("jsonl", item)) == item
    assert export_header("jsonl") == b""
