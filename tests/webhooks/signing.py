"""Test helpers: a test CA that signs SNS messages, a network-free SNS certificate host, and
Twilio signatures computed with the auth token.

Everything here produces *real* signatures; nothing patches the verifiers.

* `signing_ca()` - a self-signed CA, and `sns_leaf()` - its leaf certificate
  "sns.amazonaws.com" (RSA 2048), generated once per process. `make_leaf(...)` issues more
  leaves (expired, wrong CN, ...).
* `sns_message(...)` builds an unsigned SNS envelope (HTTP shape); `sign_sns(message,
  version="1"|"2")` adds SignatureVersion, SigningCertURL and a valid Signature. The string
  to sign is built here independently of `webhooks.sns.string_to_sign`, so a bug there cannot
  hide itself.
* `FakeCertHost` answers certificate GETs through an `httpx.MockTransport`;
  `cert_fetcher(...)` returns a real `CertificateStore` wired to it, so the real fetch code
  (status handling, size cap, PEM checks, cache, Redis) runs without any network.
* `install_sns_test_verifier(services)` swaps a gateway `Services`' certificate store and
  SNS verifier for ones wired to a `FakeCertHost` (for endpoint tests).
* `twilio_signature(url, params, token)` and `twilio_json_url(url, body)`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twilio.request_validator import RequestValidator

from webhooks.certs import CertificateStore
from webhooks.sns import SNS_HOST_PATTERN, SnsVerifier

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SNS_FIXTURES = FIXTURES / "sns"
TWILIO_FIXTURES = FIXTURES / "twilio"

TEST_REGION = "us-east-1"
TEST_CERT_URL = f"https://sns.{TEST_REGION}.amazonaws.com/SimpleNotificationService-gatewaytest.pem"
TEST_TOPIC_ARN = f"arn:aws:sns:{TEST_REGION}:123456789012:gateway-ses-feedback"
OTHER_TOPIC_ARN = f"arn:aws:sns:{TEST_REGION}:123456789012:someone-elses-topic"


_FLAGS = dict.fromkeys(
    (
        "content_commitment",
        "data_encipherment",
        "key_agreement",
        "encipher_only",
        "decipher_only",
    ),
    False,
)
_CA_USAGE = x509.KeyUsage(
    digital_signature=False, key_encipherment=False, key_cert_sign=True, crl_sign=True, **_FLAGS
)
_LEAF_USAGE = x509.KeyUsage(
    digital_signature=True, key_encipherment=True, key_cert_sign=False, crl_sign=False, **_FLAGS
)


@dataclass(frozen=True)
class Leaf:
    """A signing key and its certificate (PEM bytes included)."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class SigningCA:
    """A self-signed CA; `leaf` is its default "sns.amazonaws.com" leaf."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate

    @property
    def leaf(self) -> Leaf:
        return sns_leaf()

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Gateway Test"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


@functools.cache
def _rsa_key(slot: str) -> rsa.RSAPrivateKey:
    # Key generation is the slow part (~50 ms); keys are reused by name within a process.
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@functools.cache
def signing_ca() -> SigningCA:
    """The process-wide test CA."""
    key = _rsa_key("ca")
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name("Gateway Test Root CA"))
        .issuer_name(_name("Gateway Test Root CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=2))
        .not_valid_after(now + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return SigningCA(key=key, certificate=certificate)


@functools.cache
def sns_leaf() -> Leaf:
    """The default leaf: CN "sns.amazonaws.com", valid from yesterday for a year."""
    return make_leaf()


def make_leaf(
    *,
    common_name: str = "sns.amazonaws.com",
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    key_slot: str = "sns-leaf",
    ca: SigningCA | None = None,
    dns_names: tuple[str, ...] = ("sns.amazonaws.com",),
) -> Leaf:
    """Issue a leaf certificate from the test CA (defaults: valid from yesterday for a year)."""
    ca = ca or signing_ca()
    key = _rsa_key(key_slot)
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - timedelta(days=1))
        .not_valid_after(not_after or now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_LEAF_USAGE, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    return Leaf(key=key, certificate=builder.sign(ca.key, hashes.SHA256()))


def sns_timestamp(when: datetime | None = None) -> str:
    """An SNS-style timestamp ("2022-07-28T22:36:35.427Z")."""
    when = (when or datetime.now(UTC)).astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def sns_message(
    type_: str = "Notification",
    *,
    message: str = '{"notificationType":"Delivery"}',
    topic_arn: str = TEST_TOPIC_ARN,
    subject: str | None = None,
    timestamp: datetime | str | None = None,
    message_id: str | None = None,
    token: str | None = None,
    subscribe_url: str | None = None,
) -> dict[str, Any]:
    """An unsigned SNS envelope in the HTTP shape (confirmations get a Token and SubscribeURL)."""
    msg: dict[str, Any] = {
        "Type": type_,
        "MessageId": message_id or str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": timestamp if isinstance(timestamp, str) else sns_timestamp(timestamp),
    }
    if subject is not None:
        msg["Subject"] = subject
    if type_ in ("SubscriptionConfirmation", "UnsubscribeConfirmation"):
        msg["Token"] = token or hashlib.sha256(msg["MessageId"].encode()).hexdigest() * 2
        msg["SubscribeURL"] = subscribe_url or (
            f"https://sns.{TEST_REGION}.amazonaws.com/?Action=ConfirmSubscription"
            f"&TopicArn={topic_arn}&Token={msg['Token']}"
        )
    else:
        msg["UnsubscribeURL"] = (
            f"https://sns.{TEST_REGION}.amazonaws.com/?Action=Unsubscribe"
            f"&SubscriptionArn={topic_arn}:{uuid.uuid4()}"
        )
    return msg


def canonical_sns_string(message: Mapping[str, Any]) -> bytes:
    """The SNS string to sign, written from the AWS docs independently of webhooks.sns."""
    if message["Type"] == "Notification":
        keys = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    else:
        keys = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    out = ""
    for key in keys:
        if message.get(key) is not None:
            out += key + "\n" + message[key] + "\n"
    return out.encode()


def sign_sns(
    message: Mapping[str, Any],
    *,
    version: Literal["1", "2"] = "1",
    key: rsa.RSAPrivateKey | None = None,
    cert_url: str = TEST_CERT_URL,
) -> dict[str, Any]:
    """A copy of `message` with SignatureVersion, SigningCertURL and a valid Signature."""
    signed = dict(message)
    signed["SignatureVersion"] = version
    signed["SigningCertURL"] = cert_url
    algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()
    signer = key or sns_leaf().key
    signature = signer.sign(canonical_sns_string(signed), padding.PKCS1v15(), algorithm)
    signed["Signature"] = base64.b64encode(signature).decode()
    return signed


def sns_body(message: Mapping[str, Any]) -> bytes:
    """The request body SNS would post for `message`."""
    return json.dumps(message, indent=2).encode()


def genuine_certificates() -> dict[str, bytes]:
    """The real (expired) AWS SNS certificates of the fixtures, by file name."""
    return {p.name: p.read_bytes() for p in sorted((SNS_FIXTURES / "certs").glob("*.pem"))}


Handler = Callable[[httpx.Request], httpx.Response | None]


@dataclass
class FakeCertHost:
    """Answers GETs for SNS certificate URLs without any network.

    Lookup order: `pems[url]`, then `files[basename of the path]`, then `default_pem`
    (the test CA's SNS leaf), else 404. Only hosts matching the SNS pattern are served;
    anything else gets 404 too (the store should never ask). `handler` can override any
    answer (return None to fall through). `requests` records every URL asked for; answers
    wait for `gate` (an asyncio.Event) when one is given, and then for `delay` seconds.
    """

    pems: dict[str, bytes] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=genuine_certificates)
    default_pem: bytes | None = field(default_factory=lambda: sns_leaf().pem)
    handler: Handler | None = None
    delay: float = 0.0
    gate: asyncio.Event | None = None
    requests: list[str] = field(default_factory=list)

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        self.requests.append(url)
        if self.gate is not None:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.handler is not None:
            answer = self.handler(request)
            if answer is not None:
                return answer
        if not SNS_HOST_PATTERN.match(request.url.host):
            return httpx.Response(404)
        basename = urlsplit(url).path.rsplit("/", 1)[-1]
        body = self.pems.get(url) or self.files.get(basename) or self.default_pem
        if body is None:
            return httpx.Response(404, text="<Error><Code>NoSuchKey</Code></Error>")
        return httpx.Response(200, content=body, headers={"Content-Type": "application/x-pem-file"})

    @property
    def transport(self) -> httpx.MockTransport:
        """An httpx transport serving this host (inject into `CertificateStore`)."""
        return httpx.MockTransport(self)


def cert_fetcher(host: FakeCertHost | None = None, **store_kwargs: Any) -> CertificateStore:
    """A real `CertificateStore` whose HTTP goes to `host` (default: a new `FakeCertHost`).

    The host is reachable afterwards as ``store.fake_host`` (an attribute set for tests).
    """
    host = host or FakeCertHost()
    store = CertificateStore(transport=host.transport, **store_kwargs)
    store.fake_host = host  # type: ignore[attr-defined]
    return store


def install_sns_test_verifier(
    services: Any,
    *,
    topic_arns: tuple[str, ...] = (TEST_TOPIC_ARN,),
    host: FakeCertHost | None = None,
    clock: Callable[[], datetime] | None = None,
    max_age_seconds: float | None = None,
) -> FakeCertHost:
    """Point `services` (a gateway Services) at the fake certificate host; returns the host.

    Replaces ``services.cert_store`` and ``["sns_verifier"]`` with a real store and
    verifier whose certificate fetches go to `host` (Redis sharing kept, same prefix), so
    endpoint tests can post `sign_sns(...)` bodies without any network.
    """
    host = host or FakeCertHost()
    store = cert_fetcher(host, redis=services.redis, redis_prefix=services.settings.redis_prefix)
    services.cert_store = store
    services.sns_verifier = SnsVerifier(
        allowed_topic_arns=topic_arns,
        certs=store,
        max_age_seconds=(
            services.settings.sns_max_age_seconds if max_age_seconds is None else max_age_seconds
        ),
        **({"clock": clock} if clock is not None else {}),
    )
    return host


def fixed_clock(when: datetime | str) -> Callable[[], datetime]:
    """A clock that always says `when` (an aware datetime or an SNS/ISO timestamp)."""
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return lambda: when


def twilio_signature(url: str, params: Mapping[str, str] | None, token: str) -> str:
    """The X-Twilio-Signature Twilio would send for a form POST of `params` to `url`."""
    return str(RequestValidator(token).compute_signature(url, params or {}))


def twilio_json_url(url: str, body: bytes) -> str:
    """`url` with the ``bodySHA256`` query parameter Twilio adds for JSON bodies."""
    separator = "&" if urlsplit(url).query else "?"
    return f"{url}{separator}bodySHA256={hashlib.sha256(body).hexdigest()}"
