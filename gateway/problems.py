"""RFC 9457 problem documents for every error response.

Controllers in every package raise Litestar's `HTTPException` (or a subclass) with a `detail`
and optionally `extra={"type": ..., "title": ..., <more members>}`; the handlers here render
each as `application/problem+json`. Anything unexpected becomes a bare 500 problem document
without internals (the traceback goes to the log only), except that a database which cannot
be reached or dropped the connection, on any route, is a 503 with `Retry-After`: nothing was
done, and the same request will work once it is back (`suppression.db.is_database_unavailable`
decides, for SQLAlchemy's and asyncpg's errors alike).
"""

from __future__ import annotations

import logging
import time
from http import HTTPStatus
from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import (
    HTTP_400_BAD_REQUEST,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
)

from suppression.db import is_database_unavailable

log = logging.getLogger("gateway")

PROBLEM_JSON = "application/problem+json"

DATABASE_RETRY_AFTER_SECONDS = 5
"""`Retry-After` of the 503 answered while the database is unavailable."""

DATABASE_UNAVAILABLE_TYPE = "urn:problem:temporarily-unavailable"

# An outage fails every request: say so in the log once per interval, not once per request.
_OUTAGE_LOG_INTERVAL_SECONDS = 10.0
_outage_log = {"last": -_OUTAGE_LOG_INTERVAL_SECONDS, "suppressed": 0}


def problem_response(
    status: int, detail: str | None = None, *, type_: str = "about:blank", **members: Any
) -> Response[dict[str, Any]]:
    """Build a problem document response."""
    headers = members.pop("headers", None)
    body: dict[str, Any] = {
        "type": type_,
        "title": members.pop("title", None) or _phrase(status),
        "status": status,
    }
    if detail:
        body["detail"] = detail
    body.update(members)
    return Response(content=body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def http_exception_handler(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Render any HTTPException as a problem document."""
    extra: dict[str, Any] = dict(exc.extra) if isinstance(exc.extra, dict) else {}
    if isinstance(exc.extra, list) and exc.extra:
        extra = {"errors": exc.extra}
    type_ = extra.pop("type", "about:blank")
    detail = exc.detail if exc.detail and exc.detail != _phrase(exc.status_code) else None
    if isinstance(exc, ValidationException):
        type_ = type_ if type_ != "about:blank" else "urn:problem:validation"
    response = problem_response(exc.status_code, detail, type_=type_, **extra)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


def validation_exception_handler(
    request: Request[Any, Any, Any], exc: ValidationException
) -> Response[Any]:
    """Malformed or invalid request data: 400 with the list of errors."""
    errors = exc.extra if isinstance(exc.extra, list) else []
    return problem_response(
        exc.status_code or HTTP_400_BAD_REQUEST,
        exc.detail or "The request is invalid.",
        type_="urn:problem:validation",
        errors=errors,
    )


def too_deep_handler(request: Request[Any, Any, Any], exc: RecursionError) -> Response[Any]:
    """A body nested too deeply for the decoder is the client's problem, not ours."""
    return problem_response(
        HTTP_400_BAD_REQUEST,
        "The request body is nested too deeply.",
        type_="urn:problem:validation",
        errors=[],
    )


def database_unavailable_response() -> Response[dict[str, Any]]:
    """The 503 problem document of a request that found the database unavailable."""
    return problem_response(
        HTTP_503_SERVICE_UNAVAILABLE,
        "The database is unavailable right now; nothing was done. Retry later.",
        type_=DATABASE_UNAVAILABLE_TYPE,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


def _log_outage(request: Request[Any, Any, Any], exc: Exception) -> None:
    now = time.monotonic()
    if now - _outage_log["last"] < _OUTAGE_LOG_INTERVAL_SECONDS:
        _outage_log["suppressed"] += 1
        return
    log.warning(
        "database unavailable (%s: %s) on %s %s; answering 503 (%d similar since the last report)",
        type(exc).__name__,
        str(exc)[:200],
        request.method,
        request.url.path,
        _outage_log["suppressed"],
    )
    _outage_log["last"] = now
    _outage_log["suppressed"] = 0


def internal_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Last resort: a database outage is a 503 with `Retry-After`; anything else is logged
    and answered 500 without internals."""
    if is_database_unavailable(exc):
        _log_outage(request, exc)
        return database_unavailable_response()
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(
        HTTP_500_INTERNAL_SERVER_ERROR, "An internal error occurred.", type_="urn:problem:internal"
    )


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    ValidationException: validation_exception_handler,
    HTTPException: http_exception_handler,
    RecursionError: too_deep_handler,
    Exception: internal_error_handler,
}

__all__ = ["EXCEPTION_HANDLERS", "PROBLEM_JSON", "MediaType", "problem_response"]
