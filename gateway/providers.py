"""The providers this gateway knows: one registration line each.

A provider is a send module (a `sender.providers.spec.SendSpec`: adapter, error table,
default rate limits, settings names) and a feedback module (a `webhooks.spec.FeedbackSpec`:
routes, verifier, classification keys), paired here. Everything else reads this list: the
settings (GATEWAY_EMAIL_PROVIDER / GATEWAY_SMS_PROVIDER choices, default rate limits, the
provider's own settings), the send path's classification, the feedback path's
classification and verifiers (`gateway.services`) and the routes (`gateway.app`).

This module stays light (no SDK, no web framework): specs build their adapters and routes
on demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from retry.settings import RateSpec
from sender.classify import register_errors
from sender.providers import ses_spec, twilio_spec
from sender.providers.spec import SendSpec
from webhooks import classify as feedback_classify
from webhooks import ses as ses_feedback
from webhooks import twilio as twilio_feedback
from webhooks.spec import FeedbackSpec


@dataclass(frozen=True)
class Registration:
    """One provider: its send side and (optionally) its feedback side."""

    send: SendSpec
    feedback: FeedbackSpec | None = None

    @property
    def name(self) -> str:
        """The provider's name (the `provider` column, breaker and rate-limit keys)."""
        return self.send.name


PROVIDERS: tuple[Registration, ...] = (
    Registration(ses_spec.SEND, ses_feedback.FEEDBACK),
    Registration(twilio_spec.SEND, twilio_feedback.FEEDBACK),
)


def activate(registrations: Iterable[Registration]) -> None:
    """Make the providers' tables part of the two classifiers (idempotent)."""
    for registration in registrations:
        if registration.send.errors is not None:
            register_errors(registration.send.errors)
        feedback = registration.feedback
        if feedback is not None and feedback.table_keys is not None:
            feedback_classify.register(feedback.name, feedback.table_keys, feedback.table)


def choices(channel: str, registrations: Sequence[Registration] = PROVIDERS) -> tuple[str, ...]:
    """The provider names GATEWAY_<CHANNEL>_PROVIDER accepts (besides `sandbox`)."""
    return tuple(r.name for r in registrations if r.send.channel == channel)


def send_spec(
    name: str, channel: str, registrations: Sequence[Registration] = PROVIDERS
) -> SendSpec | None:
    """The send spec of provider `name` for `channel`, if registered."""
    for registration in registrations:
        if registration.name == name and registration.send.channel == channel:
            return registration.send
    return None


def default_rate_limits(
    registrations: Sequence[Registration] = PROVIDERS,
) -> dict[str, RateSpec]:
    """Every provider's default rate-limit buckets (GATEWAY_RATE_LIMITS replaces them)."""
    limits: dict[str, RateSpec] = {}
    for registration in registrations:
        limits.update(registration.send.rate_limits)
    return limits


def provider_env(
    env: Mapping[str, str], registrations: Sequence[Registration] = PROVIDERS
) -> dict[str, str]:
    """The values of the settings the providers declare (those that are set)."""
    names = {name for r in registrations for name in r.send.settings}
    return {name: env[name] for name in sorted(names) if env.get(name, "").strip()}


activate(PROVIDERS)
