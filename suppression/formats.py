"""File formats of suppression imports and exports (pure: bytes in, records out; no database).

Imports are read as a stream of byte chunks, record by record, so a file of any size is
processed in constant memory. Two encodings (sniffed from the first non-blank line: `{` means
JSON Lines, anything else CSV) and three families of content:

* `gateway`: our own export (CSV with a header, or JSON Lines) with at least `channel`,
  `address`, `reason`, optionally `scope` and `expires_at`; other columns are ignored.
* `ses`: Amazon SES account-level suppression list. Either the fields of SESv2
  `ListSuppressedDestinations` / `SuppressedDestinationSummary` (`EmailAddress`, `Reason` =
  BOUNCE|COMPLAINT, `LastUpdateTime`) as a CSV header or as JSON objects (e.g. the output of
  `aws sesv2 list-suppressed-destinations | jq -c '.SuppressedDestinationSummaries[]'`), or the
  SES bulk-import file layout (headerless CSV `address,BOUNCE`; JSON `{"emailAddress",
  "reason"}`).
* `sendgrid`: SendGrid suppression exports, whose columns are those of the v3 suppression API
  objects: bounces and blocks `email,created,reason,status`, spam reports `email,created,ip`,
  invalid emails `email,created,reason`, global unsubscribes `email,created`. The list kind is
  taken from the `sendgrid_list` option or sniffed from the columns (bounces and blocks share
  columns; sniffing treats them as bounces).

Reason mapping: SES BOUNCE -> hard_bounce, COMPLAINT -> complaint; SendGrid bounces ->
hard_bounce (soft_bounce with a 7-day expiry when the enhanced status is 4.x.x), blocks ->
soft_bounce with a 7-day expiry (a block is the receiving server refusing the sender, not a bad
address), spam reports -> complaint, invalid emails -> invalid_address, unsubscribes ->
unsubscribe for `unsubscribe_scope` (default `marketing`: a SendGrid global unsubscribe is an
opt-out from bulk mail, not from receipts and one-time codes).

Provider diagnostic texts often quote the recipient (`550 5.1.1 <a@b.example>: no such user`);
every email-like token is redacted before anything is kept as evidence.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from suppression.normalize import CHANNELS, Address, InvalidAddress, normalize
from suppression.service import REASONS, SCOPE_ALL, redact_text, validate_entry

IMPORT_FORMATS = ("auto", "gateway", "ses", "sendgrid")
SENDGRID_LISTS = ("bounces", "blocks", "spam_reports", "invalid_emails", "unsubscribes")
EXPORT_FORMATS = ("csv", "jsonl")
EXPORT_COLUMNS = (
    "id",
    "channel",
    "address",
    "scope",
    "reason",
    "active",
    "source_type",
    "source_id",
    "evidence",
    "created_at",
    "expires_at",
    "history",
)
# A single record (or physical line) larger than this is reported invalid and skipped.
MAX_RECORD_BYTES = 64 * 1024
# Imported temporary failures suppress for this long, then the address may be tried again.
SOFT_BOUNCE_TTL = dt.timedelta(days=7)


class UnrecognizedFormat(ValueError):
    """The first record matches none of the supported layouts (nothing was imported)."""


@dataclass(frozen=True)
class ImportOptions:
    """How to read an import; `format="auto"` sniffs the layout from the content."""

    format: str = "auto"
    sendgrid_list: str | None = None
    unsubscribe_scope: str = "marketing"
    default_region: str = "US"

    def __post_init__(self) -> None:
        if self.format not in IMPORT_FORMATS:
            raise ValueError(f"format must be one of {', '.join(IMPORT_FORMATS)}")
        if self.sendgrid_list is not None and self.sendgrid_list not in SENDGRID_LISTS:
            raise ValueError(f"sendgrid_list must be one of {', '.join(SENDGRID_LISTS)}")
        validate_entry("email", "unsubscribe", self.unsubscribe_scope)


@dataclass(frozen=True)
class ImportRecord:
    """A valid row, normalized and mapped onto our reasons and scopes."""

    line: int
    address: Address
    reason: str
    scope: str
    expires_at: dt.datetime | None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InvalidRecord:
    """A row that cannot be imported; `line` is the physical line where it starts (1-based)."""

    line: int
    error: str


Parsed = ImportRecord | InvalidRecord


def redact(text: str) -> str:
    """Replace every email-like token with `[address]` and cap the length (NULs dropped:
    PostgreSQL text and jsonb cannot hold them)."""
    return redact_text(text.replace("\x00", ""))


# --- physical lines and records ---------------------------------------------------------------


async def _lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[tuple[int, bytes | None]]:
    """(line number, bytes without EOL) per physical line; None for a line over the limit."""
    buf = bytearray()
    number = 0
    skipping = False
    first = True
    async for chunk in chunks:
        if not chunk:
            continue
        buf += chunk
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            number += 1
            line = bytes(buf[start:end])
            start = end + 1
            if skipping:
                skipping = False
                continue
            if first:
                line, first = _strip_bom(line), False
            yield number, line.rstrip(b"\r")
        del buf[:start]
        if len(buf) > MAX_RECORD_BYTES:
            if not skipping:
                yield number + 1, None
                skipping = True
            buf.clear()
    if buf and not skipping:
        line = _strip_bom(bytes(buf)) if first else bytes(buf)
        yield number + 1, line.rstrip(b"\r")


def _strip_bom(line: bytes) -> bytes:
    return line[3:] if line.startswith(b"\xef\xbb\xbf") else line


async def _csv_records(
    lines: AsyncIterator[tuple[int, bytes | None]],
) -> AsyncIterator[tuple[int, list[str]] | InvalidRecord]:
    """Logical CSV records: a quoted field may span lines (the quote count stays odd)."""
    pending: list[bytes] = []
    start = 0
    size = 0
    quotes = 0
    async for number, line in lines:
        if line is None:
            if pending:
                yield InvalidRecord(start, "unterminated quoted field")
                pending, size, quotes = [], 0, 0
            yield InvalidRecord(number, f"line longer than {MAX_RECORD_BYTES} bytes")
            continue
        if not pending:
            if not line.strip():
                continue
            start = number
        pending.append(line)
        size += len(line)
        quotes += line.count(b'"')
        if quotes % 2:
            if size > MAX_RECORD_BYTES:
                yield InvalidRecord(start, "unterminated quoted field")
                pending, size, quotes = [], 0, 0
            continue
        raw = b"\n".join(pending)
        pending, size, quotes = [], 0, 0
        try:
            text = raw.decode("utf-8")
            fields = next(csv.reader([text], strict=True))
        except UnicodeDecodeError:
            yield InvalidRecord(start, "not valid UTF-8")
            continue
        except csv.Error as exc:
            yield InvalidRecord(start, f"malformed CSV: {exc}")
            continue
        yield start, [f.strip() for f in fields]
    if pending:
        yield InvalidRecord(start, "unterminated quoted field")


# --- mapping rows onto entries ----------------------------------------------------------------

# (channel, raw address, reason, scope, expires_at, evidence)
_Mapped = tuple[str, str, str, str, dt.datetime | None, dict[str, Any]]
Mapper = Callable[[Mapping[str, Any]], _Mapped]


def _text(row: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    value = row.get(key)
    if value is None or value == "":
        if required:
            raise ValueError(f"missing {key}")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{key} must be a string")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{key} contains a NUL character")  # PostgreSQL text cannot hold it
    return str(value).strip()


def _time_text(value: Any) -> str | None:
    """A provider timestamp kept as evidence: Unix seconds become ISO 8601, text is kept."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return dt.datetime.fromtimestamp(float(value), dt.UTC).isoformat()
        except (OverflowError, OSError, ValueError):
            return None
    text = str(value).strip()
    if text.isdigit():
        return _time_text(int(text))
    return redact(text)[:64]


def _gateway(row: Mapping[str, Any]) -> _Mapped:
    channel = _text(row, "channel", required=True)
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel[:16]!r}")
    address = _text(row, "address")
    if not address:
        raise ValueError("address is empty (an erased entry cannot be imported)")
    reason = _text(row, "reason", required=True)
    scope = _text(row, "scope") or SCOPE_ALL
    expires_at = None
    raw_expiry = _text(row, "expires_at")
    if raw_expiry:
        try:
            expires_at = dt.datetime.fromisoformat(raw_expiry)
        except ValueError:
            raise ValueError("expires_at is not an ISO 8601 time") from None
        if expires_at.tzinfo is None:
            raise ValueError("expires_at needs a time zone")
        try:
            expires_at = expires_at.astimezone(dt.UTC)
        except OverflowError:  # year 1 or 9999 with an offset: no UTC equivalent
            raise ValueError("expires_at is out of range") from None
    evidence: dict[str, Any] = {"import_format": "gateway"}
    created = _time_text(row.get("created_at"))
    if created:
        evidence["original_created_at"] = created
    for key in ("source_type", "source_id"):
        value = _text(row, key)
        if value:
            evidence[f"original_{key}"] = redact(value)[:128]
    return channel, address, reason, scope, expires_at, evidence


_SES_REASONS = {"BOUNCE": "hard_bounce", "COMPLAINT": "complaint"}


def _ses(row: Mapping[str, Any]) -> _Mapped:
    address = _text(row, "emailaddress", required=True)
    ses_reason = _text(row, "reason", required=True).upper()
    if ses_reason not in _SES_REASONS:
        raise ValueError("SES reason must be BOUNCE or COMPLAINT")
    evidence: dict[str, Any] = {"import_format": "ses", "ses_reason": ses_reason}
    original = _time_text(row.get("lastupdatetime"))
    if original:
        evidence["original_time"] = original
    return "email", address, _SES_REASONS[ses_reason], SCOPE_ALL, None, evidence


def _sendgrid_kind(keys: set[str]) -> str:
    if "ip" in keys:
        return "spam_reports"
    if "status" in keys:
        return "bounces"
    if "reason" in keys:
        return "invalid_emails"
    return "unsubscribes"


def _sendgrid(options: ImportOptions, kind: str | None, now: dt.datetime) -> Mapper:
    def mapper(row: Mapping[str, Any]) -> _Mapped:
        address = _text(row, "email", required=True)
        list_kind = kind or options.sendgrid_list or _sendgrid_kind(set(row))
        status = _text(row, "status")
        expires_at = None
        scope = SCOPE_ALL
        if list_kind == "spam_reports":
            reason = "complaint"
        elif list_kind == "invalid_emails":
            reason = "invalid_address"
        elif list_kind == "unsubscribes":
            reason, scope = "unsubscribe", options.unsubscribe_scope
        elif list_kind == "blocks" or status.startswith("4"):
            reason, expires_at = "soft_bounce", now + SOFT_BOUNCE_TTL
        else:
            reason = "hard_bounce"
        evidence: dict[str, Any] = {"import_format": f"sendgrid:{list_kind}"}
        original = _time_text(row.get("created"))
        if original:
            evidence["original_time"] = original
        if status:
            evidence["status"] = redact(status)[:32]
        diagnostic = _text(row, "reason")
        if diagnostic:
            evidence["diagnostic"] = redact(diagnostic)
        return "email", address, reason, scope, expires_at, evidence

    return mapper


def _finish(
    line: int,
    mapped: _Mapped,
    options: ImportOptions,
) -> Parsed:
    channel, raw_address, reason, scope, expires_at, evidence = mapped
    try:
        validate_entry(channel, reason, scope)
    except ValueError as exc:
        return InvalidRecord(line, str(exc))
    try:
        address = normalize(channel, raw_address, options.default_region)
    except InvalidAddress as exc:
        # The problem only: the address itself stays out of reports and logs.
        return InvalidRecord(line, f"invalid address: {exc.problem}")
    return ImportRecord(line, address, reason, scope, expires_at, evidence)


def _apply(mapper: Mapper, line: int, row: Mapping[str, Any], options: ImportOptions) -> Parsed:
    try:
        mapped = mapper(row)
    except ValueError as exc:
        return InvalidRecord(line, str(exc))
    return _finish(line, mapped, options)


# --- entry point ------------------------------------------------------------------------------


async def parse_import(
    chunks: AsyncIterable[bytes], options: ImportOptions, *, now: dt.datetime | None = None
) -> AsyncIterator[Parsed]:
    """Records of an import stream, one by one; invalid rows are yielded, never raised.

    Raises `UnrecognizedFormat` before yielding anything when the first record fits none of
    the supported layouts.
    """
    now = now or dt.datetime.now(dt.UTC)
    lines = _lines(chunks)
    first: tuple[int, bytes | None] | None = None
    async for item in lines:
        if item[1] is None or item[1].strip():
            first = item
            break
    if first is None:
        return

    async def replay() -> AsyncIterator[tuple[int, bytes | None]]:
        assert first is not None
        yield first
        async for item in lines:
            yield item

    if first[1] is not None and first[1].lstrip().startswith(b"{"):
        async for parsed in _parse_jsonl(replay(), options, now):
            yield parsed
    else:
        async for parsed in _parse_csv(replay(), options, now):
            yield parsed


async def _parse_jsonl(
    lines: AsyncIterator[tuple[int, bytes | None]], options: ImportOptions, now: dt.datetime
) -> AsyncIterator[Parsed]:
    forced: dict[str, Mapper] = {
        "gateway": _gateway,
        "ses": _ses,
        "sendgrid": _sendgrid(options, None, now),
    }
    async for number, line in lines:
        if line is None:
            yield InvalidRecord(number, f"line longer than {MAX_RECORD_BYTES} bytes")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            yield InvalidRecord(number, "not a JSON object")
            continue
        if not isinstance(obj, dict):
            yield InvalidRecord(number, "not a JSON object")
            continue
        row = {str(k).lower(): v for k, v in obj.items()}
        if options.format != "auto":
            mapper = forced[options.format]
        elif "channel" in row and "address" in row:
            mapper = _gateway
        elif "emailaddress" in row:
            mapper = _ses
        elif "email" in row:
            mapper = forced["sendgrid"]
        else:
            yield InvalidRecord(
                number, "unrecognized record: expected channel+address, EmailAddress or email"
            )
            continue
        yield _apply(mapper, number, row, options)


async def _parse_csv(
    lines: AsyncIterator[tuple[int, bytes | None]], options: ImportOptions, now: dt.datetime
) -> AsyncIterator[Parsed]:
    records = _csv_records(lines)
    header: list[str] | None = None
    mapper: Mapper | None = None
    async for record in records:
        if isinstance(record, InvalidRecord):
            if mapper is None:
                raise UnrecognizedFormat(f"line {record.line}: {record.error}")
            yield record
            continue
        number, fields = record
        if mapper is None:
            header, mapper, is_data = _csv_layout(fields, options, now)
            if not is_data:
                continue
        if header is None:
            if len(fields) != 2:
                yield InvalidRecord(number, "expected two fields: address,BOUNCE|COMPLAINT")
                continue
            row: dict[str, Any] = {"emailaddress": fields[0], "reason": fields[1]}
        else:
            if len(fields) > len(header):
                yield InvalidRecord(number, f"{len(fields)} fields, header has {len(header)}")
                continue
            row = dict(zip(header, fields, strict=False))
        yield _apply(mapper, number, row, options)


def _csv_layout(
    fields: list[str], options: ImportOptions, now: dt.datetime
) -> tuple[list[str] | None, Mapper, bool]:
    """Pick the layout from the first record: (header or None, mapper, first record is data)."""
    names = [f.lower() for f in fields]
    wanted = options.format
    if wanted in ("auto", "gateway") and {"channel", "address"} <= set(names):
        if "reason" not in names:
            raise UnrecognizedFormat("gateway CSV header needs a reason column")
        return names, _gateway, False
    if wanted in ("auto", "ses") and "emailaddress" in names:
        if "reason" not in names:
            raise UnrecognizedFormat("SES CSV header needs a Reason column")
        return names, _ses, False
    if wanted in ("auto", "sendgrid") and "email" in names:
        kind = options.sendgrid_list or _sendgrid_kind(set(names))
        return names, _sendgrid(options, kind, now), False
    if wanted in ("auto", "ses") and len(fields) == 2 and fields[1].upper() in _SES_REASONS:
        # The SES bulk-import layout: no header, `address,BOUNCE|COMPLAINT` on every line.
        return None, _ses, True
    expected = {
        "auto": "a gateway, SES or SendGrid suppression file",
        "gateway": "a header with channel, address and reason",
        "ses": "an EmailAddress,Reason header or address,BOUNCE|COMPLAINT rows",
        "sendgrid": "a header with an email column",
    }[wanted]
    raise UnrecognizedFormat(f"the first line is not {expected}")


# --- export -----------------------------------------------------------------------------------


def export_header(fmt: str) -> bytes:
    """The bytes that start an export (a CSV header line; nothing for JSON Lines)."""
    if fmt == "csv":
        return _csv_line(list(EXPORT_COLUMNS))
    return b""


def export_line(fmt: str, item: Mapping[str, Any]) -> bytes:
    """One exported entry (see `EXPORT_COLUMNS`) as a CSV or JSON Lines line."""
    if fmt == "jsonl":
        return (json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    values = []
    for column in EXPORT_COLUMNS:
        value = item.get(column)
        if value is None:
            values.append("")
        elif isinstance(value, dict | list):
            values.append(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        elif isinstance(value, bool):
            values.append("true" if value else "false")
        else:
            values.append(str(value))
    return _csv_line(values)


class _LineWriter:
    def __init__(self) -> None:
        self.value = ""

    def write(self, text: str) -> int:
        self.value += text
        return len(text)


def _csv_line(values: list[str]) -> bytes:
    out = _LineWriter()
    csv.writer(out, lineterminator="\n").writerow(values)
    return out.value.encode()


__all__ = [
    "EXPORT_COLUMNS",
    "EXPORT_FORMATS",
    "IMPORT_FORMATS",
    "REASONS",
    "SENDGRID_LISTS",
    "ImportOptions",
    "ImportRecord",
    "InvalidRecord",
    "UnrecognizedFormat",
    "export_header",
    "export_line",
    "parse_import",
    "redact",
]
