"""Errors raised while receiving provider callbacks, and the verification-failure counter.

::

    WebhookError                 base; never raised itself
    ├── MalformedPayload         -> HTTP 400  the body is not what the provider sends
    │                                        (not JSON, not an object, required field missing
    │                                        or of the wrong type)
    ├── VerificationFailed       -> HTTP 403  the request is not provably from the provider;
    │                                        `reason` is a short machine-readable code
    └── TemporaryFailure         -> HTTP 503  we could not decide right now (the signing
                                             certificate could not be fetched, timed out,
                                             the certificate host answered 5xx); SNS retries

Every error has a `reason` (a short code for logs, metrics and problem documents) and a
human-readable message (`str(error)`). Messages never carry message bodies, addresses or
secrets; at most an envelope field such as the TopicArn or Timestamp (repr-quoted, cut short).

`VerificationFailed` reasons used by the verifiers in this package:

=================================  ==========================================================
reason                             meaning
=================================  ==========================================================
``bad_signature``                  the signature is not base64, or it does not verify over
                                   the canonical string (SNS) / the URL and params (Twilio)
``missing_signature``              no signature at all (SNS fields or X-Twilio-Signature)
``unsupported_signature_version``  SNS SignatureVersion other than "1" or "2"
``cert_url_not_sns``               SigningCertURL not https on an SNS host ending in .pem
``subscribe_url_not_sns``          SubscribeURL of a confirmation not https on an SNS host
``cert_unavailable``               the SNS host answered 4xx/3xx for the certificate URL
``bad_certificate``                the certificate body is not one PEM certificate, is not
                                   for SNS, or does not hold an RSA key
``expired_certificate``            the certificate is outside its validity at the clock's now
``topic_not_allowed``              TopicArn not on GATEWAY_SNS_TOPIC_ARNS
``no_topics_configured``           the SNS allow-list is empty: everything is refused
``stale_timestamp``                SNS Timestamp older than the configured maximum age
``future_timestamp``               SNS Timestamp implausibly far in the future
``unknown_message_type``           SNS Type not Notification/(Un)SubscriptionConfirmation
``raw_message_delivery``           JSON without an SNS envelope (raw message delivery)
``lambda_shape``                   the Lambda/SQS envelope (SigningCertUrl), not HTTP's
``no_token_configured``            no Twilio auth token for this account: everything refused
``bad_body_encoding``              a Twilio JSON body that is not UTF-8
=================================  ==========================================================

`MalformedPayload` uses the reason ``malformed_payload``; `TemporaryFailure` uses
``cert_fetch_failed`` (connection/TLS error, 5xx or 429 from the certificate host),
``cert_fetch_timeout`` and ``cert_fetch_busy`` (too many certificate fetches under way).

`VERIFICATION_FAILURES` (``gateway_webhook_verification_failures_total``) counts
`VerificationFailed` only (the 403s), labelled ``provider`` and ``reason``; `record_failure`
logs one line with the reason and increments it. Malformed payloads and temporary failures
are logged (one line each, with their reason) but not counted here.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

log = logging.getLogger("gateway.webhooks")

VERIFICATION_FAILURES = Counter(
    "gateway_webhook_verification_failures_total",
    "Webhook requests refused by signature verification (403), by provider and reason.",
    ["provider", "reason"],
)


class WebhookError(Exception):
    """Base of every error raised while receiving a provider callback."""

    status_code: int = 500
    default_reason: str = "webhook_error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason

    @property
    def message(self) -> str:
        """The human-readable message (no payload contents)."""
        return str(self.args[0]) if self.args else ""


class MalformedPayload(WebhookError):
    """The body is not a well-formed provider payload (HTTP 400)."""

    status_code = 400
    default_reason = "malformed_payload"


class VerificationFailed(WebhookError):
    """The request could not be proven to come from the provider (HTTP 403)."""

    status_code = 403
    default_reason = "verification_failed"


class TemporaryFailure(WebhookError):
    """Verification could not be completed right now; the sender should retry (HTTP 503)."""

    status_code = 503
    default_reason = "temporary_failure"


def record_failure(provider: str, error: WebhookError) -> None:
    """Log one line for a refused request (with `provider` and `reason` as fields of the
    structured log line); count it when it is a `VerificationFailed`."""
    fields = {"provider": provider, "reason": error.reason}
    if isinstance(error, VerificationFailed):
        VERIFICATION_FAILURES.labels(provider, error.reason).inc()
        log.warning(
            "webhook verification failed provider=%s reason=%s: %s",
            provider,
            error.reason,
            error.message,
            extra=fields,
        )
    elif isinstance(error, TemporaryFailure):
        log.warning(
            "webhook verification postponed provider=%s reason=%s: %s",
            provider,
            error.reason,
            error.message,
            extra=fields,
        )
    else:
        log.info(
            "webhook payload rejected provider=%s reason=%s: %s",
            provider,
            error.reason,
            error.message,
            extra=fields,
        )
