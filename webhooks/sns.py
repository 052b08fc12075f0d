"""Amazon SNS HTTP(S) message verification.

`SnsVerifier.verify(body)` turns the raw request body into a verified `SnsEnvelope` or raises
`MalformedPayload` (400), `VerificationFailed` (403, with a `reason`) or `TemporaryFailure`
(503, the signing certificate could not be fetched; SNS retries).

What is checked, cheapest first (so that forged messages rarely cause a certificate fetch):

1. an allow-list of TopicArns is configured at all (empty list: refuse everything);
2. the body is a JSON object (whatever the Content-Type: SNS sends ``text/plain``) with an SNS
   envelope; JSON without one is raw message delivery, which carries no signature and is
   refused;
3. Signature, SignatureVersion ("1" = SHA1withRSA, "2" = SHA256withRSA, nothing else) and
   SigningCertURL are present; the URL is https, on a host matching `SNS_HOST_PATTERN`
   (never any ``*.amazonaws.com``, never S3) and its path ends in ``.pem``;
4. Type is one of the three HTTP message types and the fields it signs are strings;
5. TopicArn is on the allow-list; Timestamp is neither older than ``max_age_seconds`` nor
   more than `FUTURE_SKEW_SECONDS` ahead of the clock;
6. for confirmations, SubscribeURL is https on an SNS host (the endpoint GETs it later, so
   this is an SSRF guard);
7. the certificate (fetched and cached by `CertificateStore`, which also checks it is a
   single PEM certificate for ``sns.amazonaws.com`` with an RSA key) is valid at the
   injectable clock's *now*;
8. the RSA PKCS#1 v1.5 signature verifies over `string_to_sign`.

Not checked: the certificate's chain of trust. SNS serves the leaf alone, and the
intermediates are not available offline, so the proof of origin is the TLS-authenticated
fetch from an SNS host of AWS (with the standard CA bundle, `SSL_CERT_FILE` honoured) plus
the subject check. Lambda-shaped envelopes (``SigningCertUrl``, ``UnsubscribeUrl``) are
refused: the HTTP endpoint only ever receives the HTTP shape.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from webhooks.errors import (
    MalformedPayload,
    VerificationFailed,
    WebhookError,
    record_failure,
)

if TYPE_CHECKING:
    from webhooks.certs import CertificateStore

__all__ = [
    "FUTURE_SKEW_SECONDS",
    "SNS_HOST_PATTERN",
    "SnsEnvelope",
    "SnsVerifier",
    "is_sns_url",
    "string_to_sign",
    "utcnow",
]

# The AWS SDK validators' host rule (PHP, JS, Ruby): sns.<region>.amazonaws.com, GovCloud
# and China (.com.cn). It excludes S3 and every other AWS host.
SNS_HOST_PATTERN = re.compile(r"^sns\.[a-zA-Z0-9\-]{3,}\.amazonaws\.com(\.cn)?$")

_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f]")

# How far a Timestamp may lie ahead of our clock (clock skew); anything beyond is refused.
FUTURE_SKEW_SECONDS = 300.0

NOTIFICATION = "Notification"
SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"

# Signed keys per message type, already in byte order (AWS "verify the signature" docs).
_NOTIFICATION_KEYS = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_CONFIRMATION_KEYS = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
_SIGNED_KEYS: dict[str, tuple[str, ...]] = {
    NOTIFICATION: _NOTIFICATION_KEYS,
    SUBSCRIPTION_CONFIRMATION: _CONFIRMATION_KEYS,
    UNSUBSCRIBE_CONFIRMATION: _CONFIRMATION_KEYS,
}
# Fields that must be present as strings (Type is checked separately; Subject is optional).
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    kind: tuple(key for key in keys if key not in ("Subject", "Type"))
    for kind, keys in _SIGNED_KEYS.items()
}
_HASHES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "1": hashes.SHA1,  # SHA1withRSA (the topic default)
    "2": hashes.SHA256,  # SHA256withRSA (SetTopicAttributes SignatureVersion=2)
}
# Any of these at the top level means the sender meant an SNS envelope.
_ENVELOPE_KEYS = frozenset(
    {"Type", "MessageId", "TopicArn", "Signature", "SignatureVersion", "SigningCertURL"}
)
_LAMBDA_KEYS = frozenset({"SigningCertUrl", "UnsubscribeUrl"})


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (the default clock)."""
    return datetime.now(UTC)


def is_sns_url(url: str, *, require_pem: bool = False) -> bool:
    """True when `url` is https on an SNS host of AWS (and, if asked, its path ends in .pem).

    No userinfo or explicit port is allowed: a real SNS URL has neither, and both are classic
    ways to make a URL parser and an HTTP client disagree about the host.
    """
    if not isinstance(url, str) or not url.isascii() or _CONTROL_OR_SPACE.search(url):
        # urlsplit silently drops tabs and newlines, an HTTP client might not: refuse them.
        return False
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    host = parts.hostname or ""
    if parts.scheme != "https" or port is not None or parts.netloc.lower() != host:
        return False  # also refuses userinfo ("user@host") and explicit ports
    if not SNS_HOST_PATTERN.match(host):
        return False
    if not require_pem:
        return True
    # A certificate URL is a plain path: no query or fragment to smuggle a ".pem" suffix.
    return parts.path.endswith(".pem") and not parts.query and not parts.fragment


@dataclass(frozen=True)
class SnsEnvelope:
    """A verified SNS message (HTTP shape). `raw` is the parsed body as received."""

    type: str
    message_id: str
    topic_arn: str
    message: str
    timestamp: datetime
    subject: str | None
    subscribe_url: str | None
    token: str | None
    raw: dict[str, Any]


def string_to_sign(message: Mapping[str, Any]) -> bytes:
    """The canonical bytes SNS signs for `message` (``Name\\nValue\\n`` per signed key).

    Keys that are absent, or null (the Lambda shape's ``"Subject": null``), are left out.
    Values are used exactly as decoded from JSON: never trim or re-serialise ``Message``.
    Raises `VerificationFailed` for an unknown Type and `MalformedPayload` for a signed
    value that is not a string.
    """
    kind = message.get("Type")
    keys = _SIGNED_KEYS.get(kind) if isinstance(kind, str) else None
    if keys is None:
        raise VerificationFailed(
            f"unknown SNS message type {str(kind)[:40]!r}", reason="unknown_message_type"
        )
    parts: list[str] = []
    for key in keys:
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise MalformedPayload(f"SNS field {key} must be a string")
        parts.append(f"{key}\n{value}\n")
    # JSON can escape a lone surrogate (`\ud800`), which has no UTF-8 form: it becomes "?"
    # (what a Java UTF-8 encoder writes for it) instead of an exception; a forged message
    # then simply fails the signature check.
    return "".join(parts).encode("utf-8", "replace")


class SnsVerifier:
    """Verifies SNS HTTP(S) deliveries for an allow-list of topics (see the module docstring)."""

    def __init__(
        self,
        *,
        allowed_topic_arns: Sequence[str],
        certs: CertificateStore,
        max_age_seconds: float = 3600.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._topics = frozenset(arn for arn in allowed_topic_arns if arn)
        self._certs = certs
        self._max_age = timedelta(seconds=max_age_seconds)
        self._future_skew = timedelta(seconds=FUTURE_SKEW_SECONDS)
        self._clock = clock

    @property
    def configured(self) -> bool:
        """False when the topic allow-list is empty; `verify` then refuses everything."""
        return bool(self._topics)

    async def verify(self, body: bytes | str) -> SnsEnvelope:
        """Verify one SNS request body; raise a `WebhookError` subclass when it is refused."""
        try:
            return await self._verify(body)
        except WebhookError as error:
            record_failure("sns", error)
            raise

    async def _verify(self, body: bytes | str) -> SnsEnvelope:
        if not self._topics:
            raise VerificationFailed(
                "no SNS topic allow-list configured (GATEWAY_SNS_TOPIC_ARNS): refusing all",
                reason="no_topics_configured",
            )
        message = _parse(body)
        _check_envelope_shape(message)
        signature, version, cert_url = _signature_fields(message)
        kind = _message_type(message)
        for key in _REQUIRED_KEYS[kind]:
            if not isinstance(message.get(key), str):
                raise MalformedPayload(f"SNS {kind} field {key} is missing or not a string")
        subject = message.get("Subject")
        if subject is not None and not isinstance(subject, str):
            raise MalformedPayload("SNS field Subject must be a string")

        topic_arn: str = message["TopicArn"]
        if topic_arn not in self._topics:
            raise VerificationFailed(
                f"TopicArn {topic_arn[:200]!r} is not on the allow-list",
                reason="topic_not_allowed",
            )
        timestamp = _parse_timestamp(message["Timestamp"])
        now = self._clock()
        if now - timestamp > self._max_age:
            raise VerificationFailed(
                f"message timestamp {message['Timestamp']} is older than "
                f"{self._max_age.total_seconds():.0f} s",
                reason="stale_timestamp",
            )
        if timestamp - now > self._future_skew:
            raise VerificationFailed(
                f"message timestamp {message['Timestamp']} lies in the future",
                reason="future_timestamp",
            )
        subscribe_url = message.get("SubscribeURL")
        if kind != NOTIFICATION and not is_sns_url(subscribe_url or ""):
            raise VerificationFailed(
                "SubscribeURL is not an https URL on an SNS host", reason="subscribe_url_not_sns"
            )

        certificate = await self._certs.get(cert_url)
        if now < certificate.not_valid_before_utc:
            raise VerificationFailed(
                "signing certificate is not valid yet", reason="expired_certificate"
            )
        if now > certificate.not_valid_after_utc:
            raise VerificationFailed(
                "signing certificate has expired", reason="expired_certificate"
            )
        public_key = certificate.public_key()
        if not isinstance(public_key, rsa.RSAPublicKey):  # the store checks this too
            raise VerificationFailed("signing key is not RSA", reason="bad_certificate")
        try:
            public_key.verify(
                signature, string_to_sign(message), padding.PKCS1v15(), _HASHES[version]()
            )
        except InvalidSignature:
            raise VerificationFailed("signature does not verify", reason="bad_signature") from None

        token = message.get("Token")
        return SnsEnvelope(
            type=kind,
            message_id=message["MessageId"],
            topic_arn=topic_arn,
            message=message["Message"],
            timestamp=timestamp,
            subject=subject,
            subscribe_url=subscribe_url if isinstance(subscribe_url, str) else None,
            token=token if isinstance(token, str) else None,
            raw=message,
        )


def _parse(body: bytes | str) -> dict[str, Any]:
    # SNS posts JSON as text/plain by default, so the Content-Type is deliberately ignored.
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise MalformedPayload("body is not JSON") from None
    if not isinstance(parsed, dict):
        raise MalformedPayload("body is not a JSON object")
    return parsed


def _check_envelope_shape(message: Mapping[str, Any]) -> None:
    if "SigningCertURL" not in message and (_LAMBDA_KEYS & message.keys() or "Records" in message):
        raise VerificationFailed(
            "Lambda/SQS-shaped SNS records are not accepted here; "
            "the endpoint takes SNS HTTP(S) deliveries only",
            reason="lambda_shape",
        )
    if not _ENVELOPE_KEYS & message.keys():
        raise VerificationFailed(
            "JSON without an SNS envelope: raw message delivery is not supported "
            "(it carries no signature); disable RawMessageDelivery on the subscription",
            reason="raw_message_delivery",
        )


def _signature_fields(message: Mapping[str, Any]) -> tuple[bytes, str, str]:
    signature = message.get("Signature")
    version = message.get("SignatureVersion")
    cert_url = message.get("SigningCertURL")
    if not (isinstance(signature, str) and isinstance(version, str) and isinstance(cert_url, str)):
        raise VerificationFailed(
            "Signature, SignatureVersion or SigningCertURL is missing",
            reason="missing_signature",
        )
    if version not in _HASHES:
        raise VerificationFailed(
            f"SignatureVersion {version[:10]!r} is not supported (only 1 and 2)",
            reason="unsupported_signature_version",
        )
    if not is_sns_url(cert_url, require_pem=True):
        raise VerificationFailed(
            "SigningCertURL is not an https .pem URL on an SNS host of AWS",
            reason="cert_url_not_sns",
        )
    try:
        raw_signature = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise VerificationFailed("Signature is not base64", reason="bad_signature") from None
    if not raw_signature:
        raise VerificationFailed("Signature is empty", reason="bad_signature")
    return raw_signature, version, cert_url


def _message_type(message: Mapping[str, Any]) -> str:
    kind = message.get("Type")
    if not isinstance(kind, str):
        raise MalformedPayload("SNS field Type is missing or not a string")
    if kind not in _SIGNED_KEYS:
        raise VerificationFailed(
            f"unknown SNS message type {kind[:40]!r}", reason="unknown_message_type"
        )
    return kind


def _parse_timestamp(value: str) -> datetime:
    # SNS writes ISO 8601 UTC with milliseconds and a Z ("2022-07-28T22:36:35.427Z").
    try:
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        # A time at the edge of the calendar with an offset ("0001-01-01T00:00:00+14:00")
        # parses but has no UTC equivalent: OverflowError, which must not become a 500.
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise MalformedPayload("SNS Timestamp is not an ISO 8601 time") from None
