"""Structured logs: one JSON object per line (or a console rendering), request ids, no
personal data.

* `configure(settings)` installs one stderr handler on the root logger whose formatter is
  structlog's `ProcessorFormatter` over standard-library records (the gateway's own and every
  library's): `GATEWAY_LOG_FORMAT=json` renders one JSON object per line, `console` a
  readable line; unset, console when stderr is a terminal and json otherwise.
* Every line carries `timestamp` (UTC, ISO 8601), `level`, `logger`, `event` (the message)
  and the context bound with `structlog.contextvars` in the task that logged it: the HTTP
  request's `request_id` (`RequestContext`), and in the retry worker the `request_id` of
  the request that created the delivery (bound by `sender.dispatch`). Fields passed with
  `extra=` become keys (e.g. a refused webhook's `provider` and `reason`).
* Personal data never reaches a line: libraries known to dump request/response payloads at
  DEBUG (botocore's request dicts hold the whole email, SQLAlchemy's echo its parameters,
  twilio's HTTP client the request's query) are rendered from their message template only,
  without the arguments; and every rendered string (message, exception text, fields) has
  email addresses and E.164 numbers (also URL-encoded) replaced by `[address]`/`[number]`.
  Code that must name a recipient logs `recipient_ref(...)`: a short prefix of its keyed
  hash.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable

import structlog
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from structlog.typing import EventDict, Processor, WrappedLogger

from gateway.settings import Settings
from suppression.db import new_id

HANDLER_NAME = "gateway"
REQUEST_ID_HEADER = "x-request-id"
# A client's X-Request-Id is used when it is a plain token (what tracing systems and load
# balancers send: UUIDs, hex, base64url, `Root=1-...`-free ids); anything else is replaced.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0,127}")

# Loggers that put whole request/response payloads (bodies, recipients, SQL parameters) in
# their arguments at DEBUG/INFO: rendered from the template only.
PAYLOAD_LOGGERS = (
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "twilio.http_client",
    "httpx",
    "httpcore",
    "hpack",
    "sqlalchemy.engine",
    "sqlalchemy.pool",
    "asyncio",
    "werkzeug",
    "moto",
)

EMAIL_PATTERN = re.compile(
    r"[A-Za-z0-9._%+'-]+(?:@|%40|%2540)[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+", re.IGNORECASE
)
PHONE_PATTERN = re.compile(r"(?:\+|%2B|%252B)\d[\d().\s-]{5,18}\d", re.IGNORECASE)
# The gateway's API keys (`gw_` + token) and bearer credentials.
SECRET_PATTERN = re.compile(r"\bgw_[A-Za-z0-9_-]{16,}|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}")


def scrub(text: str) -> str:
    """`text` with anything that looks like an email address, an E.164 number (also
    URL-encoded) or an API key replaced."""
    if "gw_" in text or "earer" in text:
        text = SECRET_PATTERN.sub("[secret]", text)
    if "@" not in text and "%" not in text and "+" not in text:
        return text
    return PHONE_PATTERN.sub("[number]", EMAIL_PATTERN.sub("[address]", text))


def recipient_ref(address_hash: str) -> str:
    """How a log line names a recipient: the first 12 characters of its keyed hash
    (`AddressProtector.hash`), enough to find it in the database, useless to anyone else."""
    return f"h:{address_hash[:12]}"


def _from_template(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Render a payload logger's record from its template, without the arguments."""
    args = event_dict.pop("positional_args", None)
    record = event_dict.get("_record")
    if args and isinstance(record, logging.LogRecord) and record.name.startswith(PAYLOAD_LOGGERS):
        event_dict["event"] = f"{record.msg} [arguments omitted]"
    return event_dict


# Attributes every LogRecord has (or gets from a formatter): not fields of the line.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "color_message",
    "taskName",
}


def _extra(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Fields given with `extra=` (e.g. a refused webhook's `provider` and `reason`)."""
    record = event_dict.get("_record")
    if isinstance(record, logging.LogRecord):
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in event_dict:
                event_dict[key] = value
    return event_dict


def _scrub_all(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    for key, value in list(event_dict.items()):
        if isinstance(value, str):
            event_dict[key] = scrub(value)
        elif key not in ("_record", "_from_structlog") and not isinstance(
            value, (int, float, bool, type(None))
        ):
            event_dict[key] = scrub(str(value))
    return event_dict


def processors(fmt: str, *, scrubbed: bool = True) -> list[Processor]:
    """The formatter's final processors for `fmt` ("json" or "console"). `scrubbed=False`
    leaves out the address/number replacement (the test suite's leak detector uses it to find
    lines that would rely on it)."""
    chain: list[Processor] = [
        structlog.stdlib.ProcessorFormatter.remove_processors_meta,
    ]
    if fmt == "json":
        chain.append(structlog.processors.format_exc_info)
    if scrubbed:
        chain.append(_scrub_all)
    if fmt == "json":
        chain.append(structlog.processors.JSONRenderer(sort_keys=False))
    else:
        chain.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    return chain


def pre_chain() -> list[Processor]:
    """What is added to every standard-library record before rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _from_template,
        _extra,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def formatter(fmt: str, *, scrubbed: bool = True) -> logging.Formatter:
    """The gateway's log formatter ("json" or "console")."""
    return structlog.stdlib.ProcessorFormatter(
        processors=processors(fmt, scrubbed=scrubbed),
        foreign_pre_chain=pre_chain(),
        # The arguments reach `_from_template`, which drops them (payload loggers) or not.
        pass_foreign_args=True,
    )


def resolved_format(settings: Settings) -> str:
    """GATEWAY_LOG_FORMAT, or console on a terminal and json otherwise."""
    if settings.log_format:
        return settings.log_format
    return "console" if sys.stderr.isatty() else "json"


def configure(settings: Settings) -> None:
    """Install (or replace) the gateway's stderr handler on the root logger."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(formatter(resolved_format(settings)))
    root.addHandler(handler)
    # Lines logged through structlog's own API (none in the gateway today) take the same path.
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )


# -- request ids -----------------------------------------------------------------------------------


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's X-Request-Id when it is a sane token, else a new one (32 hex digits)."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            try:
                text = value.decode("ascii").strip()
            except UnicodeDecodeError:
                break
            if _SANE_REQUEST_ID.fullmatch(text):
                return text
            break
    return new_id().hex


async def ensure_request_id(message: Message, scope: Scope) -> None:
    """Litestar `before_send` hook: answers that no route produced (404, 405 before routing)
    carry an `X-Request-Id` too (the client's when sane, else a new one)."""
    if message["type"] != "http.response.start":
        return
    headers = list(message.get("headers", []))
    if any(k.lower() == b"x-request-id" for k, _ in headers):
        return
    request_id = request_id_of(list(scope.get("headers", [])))
    headers.append((b"x-request-id", request_id.encode("ascii")))
    message["headers"] = headers


access_log = logging.getLogger("gateway.access")
Observe = Callable[[str, str, int, float], None]


class RequestContext:
    """ASGI middleware (every routed request): binds `request_id` in the log context for the
    request's task (and the tasks it starts), returns it in `X-Request-Id`, logs one access
    line (method, route template, status, duration; never the path, which may hold an
    address) and reports the duration to `observe` (the request-duration histogram)."""

    def __init__(self, app: ASGIApp, observe: Observe | None = None) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one request."""
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(list(scope.get("headers", [])))
        header = request_id.encode("ascii")
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                headers.append((b"x-request-id", header))
                message["headers"] = headers
            await send(message)

        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
            seconds = time.perf_counter() - started
            route = str(scope.get("path_template") or "unmatched")
            method = str(scope.get("method", ""))
            if self.observe is not None:
                self.observe(method, route, status, seconds)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    "%s %s %s %.1fms",
                    method,
                    route,
                    status,
                    seconds * 1000,
                    extra={
                        "request_id": request_id,
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(seconds * 1000, 1),
                    },
                )
