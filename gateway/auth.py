"""API authentication: `Authorization: Bearer <key>`; handlers name their scope in `opt`.

A missing or unknown key gets 401 with `WWW-Authenticate: Bearer`; a key without the scope a
route asks for (`opt={"scope": "send"}`) gets 403. `admin` implies every scope.
Keys are looked up through the process's `KeyCache` (`gateway.keycache`): a few seconds of
reuse, one SQL statement on a miss.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers.base import BaseRouteHandler

from gateway.keys import Principal
from gateway.services import Services


async def api_key_guard(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """Authenticate the bearer key and check the scope the handler requires."""
    scope = handler.opt.get("scope")
    if scope is None:
        return
    header = connection.headers.get("authorization", "")
    kind, _, secret = header.partition(" ")
    if kind.lower() != "bearer" or not secret.strip():
        raise NotAuthorizedException(
            "An API key is required: Authorization: Bearer <key>.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    services: Services = connection.app.state.services
    principal = await services.api_keys.principal(secret.strip())
    if principal is None:
        raise NotAuthorizedException(
            "The API key is unknown or revoked.",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    if not principal.allows(scope):
        raise PermissionDeniedException(f"This API key lacks the '{scope}' scope.")
    connection.state.principal = principal


def principal_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Principal:
    """The principal the guard stored for this request."""
    principal: Principal = connection.state.principal
    return principal
