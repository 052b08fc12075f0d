"""HTTP routes of the reputation guard: `GET /v1/reputation` (scope read) and
`POST /v1/reputation/{identity}/resume` (scope admin). See `sender.reputation`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Annotated, Any, cast

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter

from sender.reputation import (
    RATE_KINDS,
    IdentityReputation,
    NotPaused,
    ReputationGuard,
    ReputationStateName,
    UnknownIdentity,
)

MAX_IDENTITY = 255
MAX_REASON = 1000


def provide_reputation(state: State) -> ReputationGuard:
    """The process's guard, wired by the composition root (`services.reputation`)."""
    guard: ReputationGuard = state.services.reputation
    return guard


@dataclass
class RateView:
    """One rate of an identity over the window, in percent, with the thresholds that pause
    its marketing sends and all its sends."""

    # email: bounce, complaint; sms: failure, opt_out
    name: str
    percent: float
    marketing_paused_at: float
    all_paused_at: float


@dataclass
class ReputationView:
    """One sending identity (email: From domain; SMS: From number or Messaging Service)."""

    identity: str
    channel: str
    state: ReputationStateName
    # When the identity entered this state.
    since: dt.datetime
    # Sends in the window; below `min_sends` the thresholds do not apply.
    sends: int
    min_sends: int
    window_hours: float
    rates: list[RateView]
    evaluated_at: dt.datetime
    # While an operator's resume holds (until then, or until the rates fall back).
    hold_until: dt.datetime | None
    resumed_by: str | None
    resumed_at: dt.datetime | None
    resume_reason: str | None


@dataclass
class ReputationList:
    """Every identity the guard has evaluated, by name."""

    identities: list[ReputationView]


class ResumeRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Why the operator resumes the identity's sends (required; kept in the history)."""

    # Optional here so that a missing reason is the documented 422, not a generic 400.
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON)] | None = None


def view(item: IdentityReputation, window_hours: float) -> ReputationView:
    """The API view of one identity."""
    first, second = RATE_KINDS.get(item.channel, RATE_KINDS["email"])
    t = item.thresholds
    return ReputationView(
        identity=item.identity,
        channel=item.channel,
        state=cast(ReputationStateName, item.state),
        since=item.since,
        sends=item.sends,
        min_sends=item.min_sends,
        window_hours=window_hours,
        rates=[
            RateView(first, round(item.first_rate, 4), t.first_marketing, t.first_all),
            RateView(second, round(item.second_rate, 4), t.second_marketing, t.second_all),
        ],
        evaluated_at=item.evaluated_at,
        hold_until=item.hold_until,
        resumed_by=item.resumed_by,
        resumed_at=item.resumed_at,
        resume_reason=item.resume_reason,
    )


def _actor(request: Request[Any, Any, Any]) -> str:
    principal = getattr(request.state, "principal", None)
    key_id = getattr(principal, "key_id", None)
    return f"api_key:{key_id}" if key_id is not None else "api"


class ReputationController(Controller):
    """Rates and pause states per sending identity; an operator's resume."""

    path = "/v1/reputation"
    tags = ["reputation"]
    dependencies = {"reputation": Provide(provide_reputation, sync_to_thread=False)}

    @get("/", opt={"scope": "read"}, summary="Rates, thresholds and state per sending identity")
    async def list_identities(self, reputation: ReputationGuard) -> ReputationList:
        """Every identity as last evaluated by the worker (see README "Reputation guard")."""
        hours = reputation.settings.window_hours
        return ReputationList([view(i, hours) for i in await reputation.current()])

    @post(
        "/{identity:str}/resume",
        opt={"scope": "admin"},
        status_code=200,
        summary="Resume a paused identity's sends (reason required, recorded)",
        responses={
            404: ResponseSpec(None, description="The guard has never evaluated this identity"),
            409: ResponseSpec(None, description="The identity is not paused"),
            422: ResponseSpec(
                None, description="No reason given (urn:problem:resume-reason-required)"
            ),
        },
    )
    async def resume(
        self,
        request: Request[Any, Any, Any],
        reputation: ReputationGuard,
        identity: Annotated[
            str, Parameter(min_length=1, max_length=MAX_IDENTITY, description="The identity")
        ],
        data: ResumeRequest | None = None,
    ) -> ReputationView:
        """`ok` at once; the resume holds for GATEWAY_REPUTATION_RESUME_HOURS or until the
        rates fall back under the thresholds (a higher level still pauses)."""
        reason = data.reason if data else None
        if reason is None or not reason.strip():
            raise HTTPException(
                status_code=422,
                detail="A reason (text) is required to resume an identity.",
                extra={"type": "urn:problem:resume-reason-required"},
            )
        try:
            item = await reputation.resume(identity, actor=_actor(request), reason=reason)
        except UnknownIdentity:
            raise NotFoundException(f"No reputation state for identity {identity!r}.") from None
        except NotPaused:
            raise HTTPException(
                status_code=409,
                detail=f"Identity {identity!r} is not paused.",
                extra={"type": "urn:problem:not-paused"},
            ) from None
        return view(item, reputation.settings.window_hours)
