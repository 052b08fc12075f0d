"""HTTP endpoints of the feedback path: SNS (carrying SES) and Twilio webhooks.

Every endpoint verifies first and stores nothing for a request that fails verification
(403 problem document; the verifier logs and counts it). The body is read raw, whatever the
Content-Type (SNS posts JSON as ``text/plain``). Malformed input gets a 400 problem
document; a temporary failure (database down, certificate host unreachable) a 503 so the
provider retries; a verified request that was handled, duplicated or ignored a 200.
Routes carry no ``scope``: they are public, authenticated by the provider signature.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import httpx
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.openapi.datastructures import ResponseSpec

from webhooks import sns
from webhooks.errors import (
    MalformedPayload,
    VerificationFailed,
    WebhookError,
    record_failure,
)
from webhooks.events import (
    EMAIL,
    SUBSCRIPTION_CONFIRMATION,
    UNSUBSCRIBE_CONFIRMATION,
    FeedbackEvent,
)
from webhooks.ingest import FeedbackIngestor
from webhooks.sns import SnsEnvelope, SnsVerifier, is_sns_url
from webhooks.spec import Parser, Verifier, WebhookRequest
from webhooks.state import APPLIED, IGNORED
from webhooks.twilio_signature import TwilioVerifier

log = logging.getLogger("gateway.webhooks")

EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response></Response>'
TEXT_XML = "text/xml"
# Provider name under which SNS's own messages (subscription confirmations) are stored.
SNS = "sns"
RETRY_AFTER_SECONDS = 30
CONFIRM_TIMEOUT_SECONDS = 10.0

ReadinessCheck = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


@dataclass(frozen=True)
class WebhookContext:
    """What the webhook routes need, taken from the service graph per request."""

    ingestor: FeedbackIngestor
    sns: SnsVerifier
    twilio: TwilioVerifier
    public_url: str
    # httpx transport for the SubscribeURL GET (tests inject a MockTransport); None = network.
    confirm_transport: httpx.AsyncBaseTransport | None = None
    # Verifiers of registered providers (`webhooks.spec`), by provider name.
    verifiers: Mapping[str, Verifier] = dataclasses.field(default_factory=dict)
    default_region: str = "US"


def provide_context(state: State) -> WebhookContext:
    """Build the context from the composition root's services (``ingestor``,
    ``sns_verifier``, ``twilio_verifier``, ``sns_confirm_transport``) and the public URL."""
    services = state.services
    return WebhookContext(
        ingestor=services.ingestor,
        sns=services.sns_verifier,
        twilio=services.twilio_verifier,
        public_url=str(services.settings.public_url).rstrip("/"),
        confirm_transport=services.sns_confirm_transport,
        verifiers=services.feedback_verifiers,
        default_region=services.settings.default_region,
    )


DEPENDENCIES = {"webhooks": Provide(provide_context, sync_to_thread=False)}

# The gateway's input gate (gateway.inputs) leaves the query and headers of these routes to
# the signature check: whatever a provider signed is its data, verified, stored (NUL removed,
# see `events.storable`) and never refused for its characters.
_PROVIDER_SIGNED = {"provider_signed": True}

_RESPONSES = {
    400: ResponseSpec(None, description="Malformed body (problem document)"),
    403: ResponseSpec(None, description="Signature verification failed (problem document)"),
    503: ResponseSpec(None, description="Temporary failure; the provider should retry"),
}
_SNS_RESPONSES = {
    **_RESPONSES,
    502: ResponseSpec(None, description="Subscription confirmation failed; SNS should retry"),
}


@dataclass
class Handled:
    """What was done with each event of a verified request."""

    dispositions: list[str]


# ---- errors ---------------------------------------------------------------------------

_PROBLEM_TYPES = {
    400: "urn:problem:webhook-malformed",
    403: "urn:problem:webhook-verification-failed",
    502: "urn:problem:webhook-confirmation-failed",
    503: "urn:problem:webhook-temporarily-unavailable",
}


def _problem(status: int, detail: str, reason: str) -> HTTPException:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status in (502, 503) else None
    return HTTPException(
        status_code=status,
        detail=detail,
        headers=headers,
        extra={"type": _PROBLEM_TYPES[status], "reason": reason},
    )


def _webhook_problem(error: WebhookError) -> HTTPException:
    status = error.status_code if error.status_code in (400, 403, 503) else 400
    return _problem(status, error.message, error.reason)


def _temporary(provider: str, exc: Exception) -> HTTPException:
    # The event was verified but could not be stored or applied (database down, deadlock,
    # a bug): nothing was committed, so the provider's retry will find it again.
    log.exception(
        "webhook refused provider=%s reason=processing_failed: %s", provider, type(exc).__name__
    )
    return _problem(
        503, "The event could not be processed right now; retry later.", "processing_failed"
    )


# ---- SNS / SES ------------------------------------------------------------------------


@post(
    "/webhooks/ses",
    tags=["webhooks"],
    dependencies=DEPENDENCIES,
    opt=_PROVIDER_SIGNED,
    status_code=200,
    summary="Amazon SNS endpoint for SES notifications and event publishing",
    description=(
        "The HTTPS endpoint of an SNS subscription. Verifies the SNS signature, certificate "
        "and topic allow-list (GATEWAY_SNS_TOPIC_ARNS), confirms subscriptions, and applies "
        "SES notifications (notificationType) and event publishing (eventType)."
    ),
    responses=_SNS_RESPONSES,
)
async def ses_webhook(request: Request[Any, Any, Any], webhooks: WebhookContext) -> Handled:
    """Receive one SNS message (the body is JSON, whatever the Content-Type)."""
    body = await request.body()
    try:
        envelope = await webhooks.sns.verify(body)
    except WebhookError as error:
        raise _webhook_problem(error) from None
    if envelope.type == sns.NOTIFICATION:
        message = _ses_message(envelope.message)
        try:
            dispositions = await webhooks.ingestor.ses_message(
                message, event_id=envelope.message_id
            )
        except MalformedPayload as error:
            record_failure("ses", error)
            raise _webhook_problem(error) from None
        except Exception as exc:
            raise _temporary("ses", exc) from None
        return Handled(dispositions)
    if envelope.type == sns.SUBSCRIPTION_CONFIRMATION:
        return await _confirm_subscription(envelope, webhooks)
    if envelope.type == sns.UNSUBSCRIBE_CONFIRMATION:
        # Someone unsubscribed this endpoint; recorded for the operator, never re-subscribed.
        log.warning("SNS unsubscribed this endpoint from topic %s", envelope.topic_arn)
        return Handled([await _record(webhooks, envelope, UNSUBSCRIBE_CONFIRMATION, IGNORED)])
    unsupported = MalformedPayload(
        "unsupported SNS message type", reason="unsupported_message_type"
    )
    record_failure("sns", unsupported)
    raise _webhook_problem(unsupported)


def _ses_message(text: str) -> dict[str, Any]:
    """The SES JSON inside ``Message``; anything else is kept as an unknown notification."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    # E.g. the plain-text test message SES publishes when a destination is set up.
    return {"unparsed_message": text[:10000]}


async def _confirm_subscription(envelope: SnsEnvelope, webhooks: WebhookContext) -> Handled:
    url = envelope.subscribe_url or ""
    if not is_sns_url(url):  # the verifier checks this too: an SSRF guard never hurts twice
        error = VerificationFailed(
            "SubscribeURL is not an https URL on an SNS host", reason="subscribe_url_not_sns"
        )
        record_failure(SNS, error)
        raise _webhook_problem(error)
    try:
        async with httpx.AsyncClient(
            transport=webhooks.confirm_transport,
            timeout=CONFIRM_TIMEOUT_SECONDS,
            follow_redirects=False,
        ) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        log.warning(
            "webhook refused provider=sns reason=confirmation_failed: %s", type(exc).__name__
        )
        raise _problem(
            502, "The subscription could not be confirmed; retry later.", "confirmation_failed"
        ) from None
    if not 200 <= response.status_code < 300:
        log.warning(
            "webhook refused provider=sns reason=confirmation_failed: SNS answered %s",
            response.status_code,
        )
        raise _problem(
            502,
            f"The subscription could not be confirmed (SNS answered {response.status_code}).",
            "confirmation_failed",
        )
    log.info("confirmed the SNS subscription to topic %s", envelope.topic_arn)
    return Handled([await _record(webhooks, envelope, SUBSCRIPTION_CONFIRMATION, APPLIED)])


async def _record(
    webhooks: WebhookContext, envelope: SnsEnvelope, event_type: str, disposition: str
) -> str:
    event = FeedbackEvent(
        provider=SNS,
        provider_event_id=envelope.message_id,
        event_type=event_type,
        channel=EMAIL,
        occurred_at=envelope.timestamp,
        details={"topic_arn": envelope.topic_arn},
        raw=envelope.raw,
    )
    try:
        return await webhooks.ingestor.record(event, disposition=disposition)
    except Exception as exc:
        raise _temporary(SNS, exc) from None


# ---- Twilio ---------------------------------------------------------------------------


class _FormParams(dict[str, str]):
    """Form fields (first value per name) that also hand every value to the validator."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__()
        self._all: dict[str, list[str]] = {}
        for name, value in pairs:
            self.setdefault(name, value)
            self._all.setdefault(name, []).append(value)

    def getall(self, name: str) -> list[str]:
        return list(self._all.get(name, []))


async def _verified_twilio(
    request: Request[Any, Any, Any], webhooks: WebhookContext
) -> tuple[_FormParams, dict[str, str]]:
    """Parse and verify a Twilio webhook; (form params, callback URL query)."""
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True) if body else []
    except (UnicodeDecodeError, ValueError):
        error = MalformedPayload("body is not a UTF-8 form")
        record_failure("twilio", error)
        raise _webhook_problem(error) from None
    if content_type.split(";", 1)[0].strip().lower() == "application/json":
        pairs = []  # JSON bodies are signed through bodySHA256 in the URL
    params = _FormParams(pairs)
    query_string = request.scope.get("query_string", b"").decode("latin-1")
    # Twilio signs the URL it called: our public URL (behind proxies) + path + query as sent.
    url = webhooks.public_url + request.url.path + (f"?{query_string}" if query_string else "")
    try:
        webhooks.twilio.verify(
            url=url,
            params=params,
            raw_body=body,
            signature=request.headers.get("x-twilio-signature"),
            account_sid=params.get("AccountSid"),
            content_type=content_type,
        )
    except WebhookError as error:
        raise _webhook_problem(error) from None
    return params, dict(parse_qsl(query_string, keep_blank_values=True))


@post(
    "/webhooks/twilio/status",
    tags=["webhooks"],
    dependencies=DEPENDENCIES,
    opt=_PROVIDER_SIGNED,
    status_code=200,
    summary="Twilio message status callbacks",
    description=(
        "Verified with X-Twilio-Signature over GATEWAY_PUBLIC_URL + path + query. The `d` "
        "query parameter of the callback URL carries the delivery id."
    ),
    responses=_RESPONSES,
)
async def twilio_status_webhook(
    request: Request[Any, Any, Any], webhooks: WebhookContext
) -> Handled:
    """Receive one status callback."""
    params, query = await _verified_twilio(request, webhooks)
    try:
        dispositions = await webhooks.ingestor.twilio_status(
            params,
            query=query,
            idempotency_token=request.headers.get("i-twilio-idempotency-token"),
        )
    except MalformedPayload as error:
        record_failure("twilio", error)
        raise _webhook_problem(error) from None
    except Exception as exc:
        raise _temporary("twilio", exc) from None
    return Handled(dispositions)


@post(
    "/webhooks/twilio/inbound",
    tags=["webhooks"],
    dependencies=DEPENDENCIES,
    opt=_PROVIDER_SIGNED,
    status_code=200,
    media_type=TEXT_XML,
    summary="Twilio inbound SMS (STOP/START/HELP, Advanced Opt-Out OptOutType)",
    description="Replies with empty TwiML: the gateway never answers an SMS itself.",
    responses=_RESPONSES,
)
async def twilio_inbound_webhook(
    request: Request[Any, Any, Any], webhooks: WebhookContext
) -> Response[str]:
    """Receive one inbound SMS."""
    params, _ = await _verified_twilio(request, webhooks)
    try:
        await webhooks.ingestor.twilio_inbound(
            params, idempotency_token=request.headers.get("i-twilio-idempotency-token")
        )
    except MalformedPayload as error:
        record_failure("twilio", error)
        raise _webhook_problem(error) from None
    except Exception as exc:
        raise _temporary("twilio", exc) from None
    return Response(EMPTY_TWIML, media_type=TEXT_XML, status_code=200)


SES_ROUTES: list[Any] = [ses_webhook]
TWILIO_ROUTES: list[Any] = [twilio_status_webhook, twilio_inbound_webhook]
ROUTES: list[Any] = [*SES_ROUTES, *TWILIO_ROUTES]


# ---- a registered provider ---------------------------------------------------------------


def webhook_route(
    provider: str,
    path: str,
    parse: Parser,
    *,
    summary: str,
    description: str | None = None,
) -> Any:
    """The endpoint of a registered provider (`webhooks.spec.FeedbackSpec`): verify with the
    provider's verifier (403, nothing stored), parse (400), ingest (503 when it cannot be
    stored now), answer the dispositions, like the built-in endpoints."""

    async def handler(request: Request[Any, Any, Any], webhooks: WebhookContext) -> Handled:
        body = await request.body()
        query_string = request.scope.get("query_string", b"").decode("latin-1")
        incoming = WebhookRequest(
            url=webhooks.public_url
            + request.url.path
            + (f"?{query_string}" if query_string else ""),
            body=body,
            headers={k.lower(): v for k, v in request.headers.items()},
            query=dict(parse_qsl(query_string, keep_blank_values=True)),
            default_region=webhooks.default_region,
        )
        verifier = webhooks.verifiers.get(provider)
        try:
            if verifier is None:
                raise VerificationFailed(
                    f"no verifier configured for {provider}", reason="no_verifier_configured"
                )
            checked = verifier.verify(incoming)
            if inspect.isawaitable(checked):
                await checked
            events = parse(incoming)
        except WebhookError as error:
            record_failure(provider, error)
            raise _webhook_problem(error) from None
        try:
            dispositions = await webhooks.ingestor.ingest(events)
        except Exception as exc:
            raise _temporary(provider, exc) from None
        return Handled(dispositions)

    handler.__name__ = handler.__qualname__ = f"{provider}_webhook"
    return post(
        path,
        tags=["webhooks"],
        dependencies=DEPENDENCIES,
        opt=_PROVIDER_SIGNED,
        status_code=200,
        summary=summary,
        description=description,
        responses=_RESPONSES,
    )(handler)


def readiness(extra: Mapping[str, Any]) -> ReadinessCheck:
    """A /readyz check saying whether each webhook accepts anything (never critical).

    An endpoint without its allow-list or token refuses everything (fail closed); that is
    reported, but it does not make the process unready.
    """

    async def check() -> tuple[bool, dict[str, Any]]:
        sns_verifier = extra.get("sns_verifier")
        tw = extra.get("twilio_verifier")
        others = {
            name: "configured" if verifier.configured else "refusing: not configured"
            for name, verifier in (extra.get("verifiers") or {}).items()
        }
        return True, {
            **others,
            "critical": False,
            "ses": "configured"
            if sns_verifier is not None and sns_verifier.configured
            else "refusing: no GATEWAY_SNS_TOPIC_ARNS",
            "twilio": "configured"
            if tw is not None and tw.configured
            else "refusing: no GATEWAY_TWILIO_AUTH_TOKEN",
        }

    return check


__all__ = [
    "EMPTY_TWIML",
    "ROUTES",
    "SES_ROUTES",
    "TWILIO_ROUTES",
    "Handled",
    "WebhookContext",
    "readiness",
    "webhook_route",
]
