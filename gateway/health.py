"""Liveness and readiness endpoints."""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi.datastructures import ResponseSpec
from sqlalchemy import text

from gateway.services import ReadinessCheck, Services
from retry.shared import UNAVAILABLE_REASON


@get("/healthz", tags=["health"], summary="Process is alive")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@get(
    "/readyz",
    tags=["health"],
    summary="Dependencies are reachable",
    responses={
        503: ResponseSpec(
            dict[str, Any],
            description="A critical dependency is not (same document)",
            generate_examples=False,
        )
    },
)
async def readyz(state: State) -> Response[dict[str, Any]]:
    """Readiness: the database answers, Redis too when configured, plus package checks."""
    services: Services = state.services
    checks: dict[str, Any] = {}
    ready = True

    async def database() -> tuple[bool, dict[str, Any]]:
        async with services.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        return True, {}

    async def redis() -> tuple[bool, dict[str, Any]]:
        # Not critical: without Redis the process still serves; sends are deferred
        # (`deferred: rate limiter unavailable`, see retry.shared) until it answers again.
        assert services.redis is not None
        try:
            await services.redis.ping()
        except Exception as exc:
            return False, {
                "critical": False,
                "error": type(exc).__name__,
                "effect": f"sends {UNAVAILABLE_REASON}",
            }
        return True, {}

    probes: dict[str, ReadinessCheck] = {"database": database}
    if services.redis is not None:
        probes["redis"] = redis
    probes.update(services.readiness)
    degraded = False
    for name, probe in probes.items():
        try:
            ok, details = await asyncio.wait_for(probe(), timeout=3.0)
        except Exception as exc:
            ok, details = False, {"error": type(exc).__name__}
        checks[name] = {"ok": ok, **details}
        # Package checks may report a degraded-but-serving state (e.g. an open breaker) with
        # "critical": False; only critical failures make the process unready.
        if not ok and details.get("critical", True):
            ready = False
        elif not ok:
            degraded = True
    if services.redis is None:
        checks["redis"] = {"ok": True, "configured": False}
    # "degraded": serving, but a non-critical dependency is down (its check says what that
    # means); load balancers keep the process (200).
    status = "unready" if not ready else "degraded" if degraded else "ready"
    return Response({"status": status, "checks": checks}, status_code=200 if ready else 503)
