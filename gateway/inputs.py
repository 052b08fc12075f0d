"""One gate for everything a client sends, applied to every route before its handler runs.

* Text: NUL, the other C0 control characters and lone surrogates are refused in the path,
  the query string, header values and every string (and object key) of a JSON body.
  PostgreSQL text cannot hold NUL (it used to surface as a 500), a lone surrogate cannot be
  encoded as UTF-8, and CR/LF in a value that ends in an email header (`subject`, `from`,
  `reply_to`, tags) is header injection. Tab, line feed and carriage return are allowed only
  in the multi-line body fields a route names in its `opt` (`MULTILINE_OPT`, e.g. the `text`,
  `html` and `body` of a message). A JSON body gets 422 (well-formed, invalid value); the
  path, the query and headers get 400 (a malformed request).
* Sizes: the path, the query string and each header value are bounded (414/431); string
  fields are bounded by their schemas (`max_length`, shown in openapi.yaml), the body by
  `GATEWAY_MAX_BODY_BYTES`.
* Content type: a route that parses a JSON body (`data` parameter) takes only
  `application/json` (or `application/*+json`); anything else with a body is 415.

Routes that read their body raw (webhooks, one-click unsubscribe, import) have no `data`
parameter: their bodies are the business of their own parsers. Provider webhooks
(`opt["provider_signed"]`) also keep the characters of their query and headers: the provider
signed the URL and its parameters, so the signature check decides (403 for a forgery), and a
genuine callback is stored (NUL removed, lone surrogates replaced by
`webhooks.events.storable`) rather than refused and lost.

Cost on the send path: a few `bytes`/`str` scans; a JSON body is decoded a second time only
when it holds a backslash escape that can produce a control character or a surrogate (a
line break in `text` does; a long HTML part then costs about two decodes more).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_to_bytes

import msgspec
from litestar import Request
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler

# A route's `opt` key naming the top-level JSON fields that are multi-line body text.
MULTILINE_OPT = "multiline_fields"
# A route's `opt` key marking a provider webhook: its query and headers go to the signature
# check as they are (only their sizes are bounded here).
SIGNED_OPT = "provider_signed"

MAX_PATH_BYTES = 2048
MAX_QUERY_BYTES = 8192
MAX_HEADER_VALUE_BYTES = 8192

TEXT_PROBLEM = "urn:problem:invalid-text"

# Compiled once: C0 controls (U+0000-U+001F) and surrogate code points. A surrogate left in a
# decoded Python string is always a lone one (a valid pair decodes to one code point).
_SINGLE_LINE_BAD = re.compile("[\x00-\x1f\ud800-\udfff]")
_MULTI_LINE_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
# Header values: HTAB is legal (RFC 9110 section 5.5), every other control is not.
_HEADER_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# A JSON string holds a control character or a surrogate only through one of these escapes
# (raw control bytes are invalid JSON and refused by the decoder). A false positive (an
# escaped backslash followed by `n`) only costs the exact check below.
_SUSPECT_ESCAPE = re.compile(rb"\\[bfnrtu]")
# C0 controls but tab, line feed and carriage return, as bytes (UTF-8 continuation and lead
# bytes are all >= 0x80, so a byte scan of the encoded text is exact).
_C0_BUT_LINES = bytes(c for c in range(0x20) if c not in (0x09, 0x0A, 0x0D))
_JSON_MEDIA = "application/json"

_NAMES = {0x00: "a NUL character", 0x09: "a tab", 0x0A: "a line feed", 0x0D: "a carriage return"}


def _multiline_ok(value: str) -> bool:
    # Long bodies with line breaks: an encode and a byte deletion run at C speed, where a
    # regex over the string costs several times as much.
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return len(data.translate(None, _C0_BUT_LINES)) == len(data)


def text_problem(value: str, *, multiline: bool = False) -> str | None:
    """Why `value` is not acceptable text, or None when it is."""
    if value.isprintable():  # C speed; false for controls and surrogates (and e.g. NBSP)
        return None
    if multiline and _multiline_ok(value):
        return None
    bad = (_MULTI_LINE_BAD if multiline else _SINGLE_LINE_BAD).search(value)
    if bad is None:
        return None
    code = ord(bad.group())
    if code >= 0xD800:
        return f"contains a lone surrogate (U+{code:04X}), which is not valid Unicode text"
    name = _NAMES.get(code, f"a control character (U+{code:04X})")
    if code in (0x09, 0x0A, 0x0D):
        return f"contains {name}; this field is a single line"
    return f"contains {name}"


# Percent-escapes of bytes that are not UTF-8 (e.g. `%ED%A0%80`, a surrogate's CESU-8
# bytes) would otherwise be decoded to U+FFFD and pass silently.
_NOT_UTF8 = "The {} is not UTF-8 text once percent-decoded."


def _utf8_when_unquoted(raw: bytes) -> bool:
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _refuse(status: int, detail: str, errors: list[dict[str, str]]) -> HTTPException:
    return HTTPException(
        status_code=status, detail=detail, extra={"type": TEXT_PROBLEM, "errors": errors}
    )


def _walk(
    value: Any, where: str, multiline: frozenset[str], top: bool, errors: list[dict[str, str]]
) -> None:
    if isinstance(value, str):
        problem = text_problem(value, multiline=top and where in multiline)
        if problem:
            errors.append({"field": where, "problem": problem})
    elif isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and (problem := text_problem(key)):
                errors.append({"field": name, "problem": f"the key {problem}"})
            _walk(item, name, multiline, not where, errors)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, f"{where}[{i}]", multiline, False, errors)


def body_text_errors(body: bytes, multiline: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """The text problems of a JSON body (empty when none, or when it is not JSON at all: the
    route's own decoding then answers 400)."""
    if _SUSPECT_ESCAPE.search(body) is None:
        return []
    try:
        decoded = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return []
    errors: list[dict[str, str]] = []
    _walk(decoded, "", multiline, True, errors)
    return errors


def _takes_json(handler: HTTPRouteHandler) -> bool:
    # The parsed signature is built once per handler at start-up.
    return "data" in handler.parsed_fn_signature.parameters


def _check_query(request: Request[Any, Any, Any], query: bytes) -> None:
    if b"%" in query and not _utf8_when_unquoted(query):
        raise _refuse(
            400, _NOT_UTF8.format("query string"), [{"query": "query", "problem": "not UTF-8"}]
        )
    errors = [
        {"parameter": name, "problem": problem}
        for name, value in request.query_params.multi_items()
        if (problem := text_problem(name) or text_problem(str(value)))
    ]
    if errors:
        raise _refuse(400, "A query parameter holds characters text cannot.", errors)


async def check_request(request: Request[Any, Any, Any]) -> None:
    """The gate (an app-wide `before_request` hook): raise a 4xx problem or return None."""
    scope = request.scope
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogatepass")
    if len(raw_path) > MAX_PATH_BYTES:
        raise HTTPException(status_code=414, detail=f"The path exceeds {MAX_PATH_BYTES} bytes.")
    handler = request.route_handler
    signed = bool(handler.opt.get(SIGNED_OPT))
    if b"%" in raw_path and not _utf8_when_unquoted(raw_path):
        raise _refuse(400, _NOT_UTF8.format("path"), [{"path": "path", "problem": "not UTF-8"}])
    if problem := text_problem(scope["path"]):
        raise _refuse(400, f"The path {problem}.", [{"path": "path", "problem": problem}])
    query = scope.get("query_string", b"")
    if query:
        if len(query) > MAX_QUERY_BYTES:
            raise HTTPException(
                status_code=414, detail=f"The query string exceeds {MAX_QUERY_BYTES} bytes."
            )
        if not signed:
            _check_query(request, query)
    for name, value in scope["headers"]:
        if len(value) > MAX_HEADER_VALUE_BYTES:
            raise HTTPException(
                status_code=431,
                detail=f"The {name.decode('latin-1')} header exceeds "
                f"{MAX_HEADER_VALUE_BYTES} bytes.",
            )
        if not signed and _HEADER_BAD.search(value):
            header = name.decode("latin-1")
            raise _refuse(
                400,
                f"The {header} header holds a control character.",
                [{"header": header, "problem": "contains a control character"}],
            )
    if not isinstance(handler, HTTPRouteHandler) or not _takes_json(handler):
        return
    body = await request.body()
    if not body:
        return
    media_type = request.content_type[0].lower()
    if media_type != _JSON_MEDIA and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        raise HTTPException(
            status_code=415,
            detail=f"The body must be JSON sent as Content-Type: {_JSON_MEDIA} "
            f"(got {media_type or 'none'}).",
            extra={"type": "urn:problem:unsupported-media-type"},
        )
    errors = body_text_errors(body, frozenset(handler.opt.get(MULTILINE_OPT, ())))
    if errors:
        fields = ", ".join(e["field"] for e in errors[:5])
        raise _refuse(422, f"Invalid text in {fields}.", errors)


__all__ = [
    "MAX_HEADER_VALUE_BYTES",
    "MAX_PATH_BYTES",
    "MAX_QUERY_BYTES",
    "MULTILINE_OPT",
    "SIGNED_OPT",
    "TEXT_PROBLEM",
    "body_text_errors",
    "check_request",
    "text_problem",
]
