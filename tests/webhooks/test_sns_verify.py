"""SNS message verification: genuine AWS vectors, the string-to-sign and cert-URL tables, and
messages signed at test time by the test CA for the cases the vectors lack."""

from __future__ import annotations

import base64
import json
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.services import Services, build_services
from gateway.settings import Settings
from tests.support.metrics import total, value
from tests.webhooks.signing import (
    OTHER_TOPIC_ARN,
    SNS_FIXTURES,
    TEST_CERT_URL,
    TEST_TOPIC_ARN,
    FakeCertHost,
    cert_fetcher,
    fixed_clock,
    make_leaf,
    sign_sns,
    sns_body,
    sns_message,
)
from webhooks.certs import CertificateStore
from webhooks.errors import (
    VERIFICATION_FAILURES,
    MalformedPayload,
    TemporaryFailure,
    VerificationFailed,
)
from webhooks.sns import SnsEnvelope, SnsVerifier, is_sns_url, string_to_sign

GENUINE = sorted(p for p in SNS_FIXTURES.glob("*.json") if not p.name.endswith("-vectors.json"))
LAMBDA = sorted((SNS_FIXTURES / "lambda-format").glob("*.json"))
INVALID = sorted((SNS_FIXTURES / "invalid").glob("*.json"))
AWSDOCS = sorted((SNS_FIXTURES / "awsdocs-format-examples").glob("*.http"))

# Why each invalid vector must fail, as (error class, reason) for our verifier.
INVALID_EXPECTED: dict[str, tuple[type[Exception], str]] = {
    "derived-message-tampered.json": (VerificationFailed, "bad_signature"),
    "derived-ses-message-reserialized.json": (VerificationFailed, "bad_signature"),
    "derived-ses-message-trailing-newline-stripped.json": (VerificationFailed, "bad_signature"),
    "derived-subject-removed.json": (VerificationFailed, "bad_signature"),
    # The SubscribeURL was moved to "sns.us-east-1.amazonaws.com.evil.example": caught by the
    # SSRF guard before the (also failing) signature check.
    "derived-subscribeurl-tampered.json": (VerificationFailed, "subscribe_url_not_sns"),
    "derived-sv2-downgraded-to-sv1.json": (VerificationFailed, "bad_signature"),
    "derived-type-changed-to-unsubscribeconfirmation.json": (VerificationFailed, "bad_signature"),
    "djangoses-simple-msg-unsigned.json": (VerificationFailed, "missing_signature"),
    # Lambda shape (SigningCertUrl): refused as such; the HTTP endpoint never receives it.
    "lambdalocal-2017-lambda-ses-delivery-anonymised.json": (VerificationFailed, "lambda_shape"),
    "ruby-lambda-sv1-signature-bad.json": (VerificationFailed, "lambda_shape"),
    "raku-notification-certurl-example-com.json": (VerificationFailed, "cert_url_not_sns"),
    "raku-subscriptionconfirmation-certurl-example-com.json": (
        VerificationFailed,
        "cert_url_not_sns",
    ),
    "ruby-certurl-http.json": (VerificationFailed, "cert_url_not_sns"),
    "ruby-certurl-not-aws.json": (VerificationFailed, "cert_url_not_sns"),
    "ruby-certurl-not-pem.json": (VerificationFailed, "cert_url_not_sns"),
    "ruby-signatureversion-3.json": (VerificationFailed, "unsupported_signature_version"),
    "ruby-sv1-signature-bad.json": (VerificationFailed, "bad_signature"),
    "ruby-sv2-signature-bad.json": (VerificationFailed, "bad_signature"),
}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_bytes())
    return data


def raw(path: Path) -> bytes:
    return path.read_bytes()


def genuine_host() -> FakeCertHost:
    """A certificate host serving only the genuine AWS certificates (by file name)."""
    return FakeCertHost(default_pem=None)


def verifier_for(
    message: dict[str, Any],
    store: CertificateStore,
    *,
    clock: Callable[[], datetime] | None = None,
    max_age_seconds: float = 3600.0,
) -> SnsVerifier:
    """A verifier allowing `message`'s topic, with the clock at its Timestamp."""
    return SnsVerifier(
        allowed_topic_arns=[message.get("TopicArn") or TEST_TOPIC_ARN],
        certs=store,
        max_age_seconds=max_age_seconds,
        clock=clock or fixed_clock(message["Timestamp"]),
    )


@pytest.fixture
def host() -> FakeCertHost:
    return FakeCertHost()


@pytest.fixture
def verifier(host: FakeCertHost) -> SnsVerifier:
    return SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=cert_fetcher(host))


async def refused(
    verifier: SnsVerifier,
    body: bytes | str,
    reason: str,
    kind: type[Exception] = VerificationFailed,
) -> Exception:
    with pytest.raises(kind) as info:
        await verifier.verify(body)
    assert getattr(info.value, "reason", None) == reason, info.value
    return info.value


# --- genuine AWS vectors --------------------------------------------------------------


def test_the_vector_tables_are_complete() -> None:
    # Guards the parametrisations below against silently losing fixtures.
    assert len(GENUINE) == 10 and len(LAMBDA) == 3 and len(AWSDOCS) == 4
    assert sorted(p.name for p in INVALID) == sorted(INVALID_EXPECTED)


@pytest.mark.parametrize("path", GENUINE, ids=lambda p: p.name)
async def test_genuine_aws_messages_verify(path: Path) -> None:
    message = load(path)
    host = genuine_host()
    envelope = await verifier_for(message, cert_fetcher(host)).verify(raw(path))

    assert isinstance(envelope, SnsEnvelope)
    assert envelope.type == message["Type"]
    assert envelope.message_id == message["MessageId"]
    assert envelope.topic_arn == message["TopicArn"]
    assert envelope.message == message["Message"]  # byte-exact, never re-serialised
    assert envelope.subject == message.get("Subject")
    assert envelope.timestamp == datetime.fromisoformat(message["Timestamp"])
    assert envelope.raw == message
    if message["Type"] == "SubscriptionConfirmation":
        assert envelope.subscribe_url == message["SubscribeURL"]
        assert envelope.token == message["Token"]
    else:
        assert envelope.subscribe_url is None and envelope.token is None
    assert host.requests == [message["SigningCertURL"]]


@pytest.mark.parametrize("path", GENUINE, ids=lambda p: p.name)
async def test_genuine_messages_fail_once_their_certificate_expired(path: Path) -> None:
    # With a real clock these certificates (expired 2017 / 2022) must be refused; allow any
    # message age so that the certificate check is what fires.
    message = load(path)
    store = cert_fetcher(genuine_host())
    certificate = await store.get(message["SigningCertURL"])
    after = certificate.not_valid_after_utc + timedelta(seconds=1)
    verifier = verifier_for(message, store, clock=lambda: after, max_age_seconds=1e10)
    await refused(verifier, raw(path), "expired_certificate")

    before = certificate.not_valid_before_utc - timedelta(seconds=1)
    verifier = verifier_for(message, store, clock=lambda: before, max_age_seconds=1e10)
    with pytest.raises(VerificationFailed) as info:
        await verifier.verify(raw(path))
    # The timestamp may be "in the future" of that clock; either refusal is right.
    assert info.value.reason in ("expired_certificate", "future_timestamp")


async def test_genuine_messages_are_stale_with_todays_clock() -> None:
    path = SNS_FIXTURES / "awsphp-2022-notification-sv2-subject.json"
    verifier = verifier_for(
        load(path), cert_fetcher(genuine_host()), clock=lambda: datetime.now(UTC)
    )
    await refused(verifier, raw(path), "stale_timestamp")


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
async def test_invalid_vectors_are_refused(path: Path) -> None:
    message = load(path)
    kind, reason = INVALID_EXPECTED[path.name]
    # djangoses' unsigned sample has Timestamp "Yesterday": use the real clock for it.
    clock = (
        fixed_clock(message["Timestamp"])
        if message["Timestamp"][:2] in ("20", "19")
        else lambda: datetime.now(UTC)
    )
    verifier = verifier_for(message, cert_fetcher(genuine_host()), clock=clock)
    await refused(verifier, raw(path), reason, kind)


@pytest.mark.parametrize(
    "name",
    [
        "raku-notification-certurl-example-com.json",
        "raku-subscriptionconfirmation-certurl-example-com.json",
    ],
)
async def test_cert_url_check_is_separate_from_the_signature(name: str) -> None:
    # These two still carry a valid AWS signature (SigningCertURL is not signed): the URL
    # check alone must refuse them, and nothing may be fetched from example.com.
    message = load(SNS_FIXTURES / "invalid" / name)
    host = genuine_host()
    await refused(
        verifier_for(message, cert_fetcher(host)), json.dumps(message), "cert_url_not_sns"
    )
    assert host.requests == []
    genuine_url = (
        "https://sns.us-east-1.amazonaws.com/"
        "SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"
    )
    repaired = dict(message, SigningCertURL=genuine_url)
    envelope = await verifier_for(message, cert_fetcher(host)).verify(json.dumps(repaired))
    assert envelope.message_id == message["MessageId"]


@pytest.mark.parametrize("path", LAMBDA, ids=lambda p: p.name)
async def test_lambda_shape_is_refused_but_its_signature_is_understood(path: Path) -> None:
    message = load(path)
    assert message["Subject"] is None and "SigningCertUrl" in message
    error = await refused(verifier_for(message, cert_fetcher()), raw(path), "lambda_shape")
    assert "HTTP" in str(error)

    # string_to_sign leaves the null Subject out, and the genuine signature verifies over it.
    store = cert_fetcher(genuine_host())
    certificate = await store.get(message["SigningCertUrl"])
    algorithm = hashes.SHA1() if message["SignatureVersion"] == "1" else hashes.SHA256()
    public_key = certificate.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    public_key.verify(
        base64.b64decode(message["Signature"]),
        string_to_sign(message),
        padding.PKCS1v15(),
        algorithm,
    )


async def test_message_with_unavailable_certificate_is_refused() -> None:
    path = (
        SNS_FIXTURES / "unverifiable" / "aerendir-2018-ses-notification-bounce-suppressed-sv1.json"
    )
    message = load(path)
    host = genuine_host()  # does not have SimpleNotificationService-eaea6120...pem: 404
    await refused(verifier_for(message, cert_fetcher(host)), raw(path), "cert_unavailable")
    assert host.requests == [message["SigningCertURL"]]


@pytest.mark.parametrize("path", AWSDOCS, ids=lambda p: p.name)
async def test_awsdocs_examples_with_placeholder_signatures_are_refused(path: Path) -> None:
    head, _, body = raw(path).decode().partition("\n\n")
    if not body.strip():
        # The headers-only example has no body at all: not JSON.
        await refused(
            verifier_for({"Timestamp": "2012-01-01T00:00:00Z"}, cert_fetcher()),
            body,
            "malformed_payload",
            MalformedPayload,
        )
        return
    message = json.loads(body)
    assert message["Type"] in head  # x-amz-sns-message-type matches the body
    store = cert_fetcher(genuine_host())
    with pytest.raises(VerificationFailed) as info:
        await verifier_for(message, store).verify(body)
    assert info.value.reason in ("bad_signature", "cert_unavailable")


# --- tables: string to sign, certificate URLs ---------------------------------------------


def _pairs(canonical: str) -> dict[str, str]:
    lines = canonical.split("\n")
    assert lines[-1] == ""
    return dict(zip(lines[0:-1:2], lines[1:-1:2], strict=True))


STRING_VECTORS = json.loads((SNS_FIXTURES / "string-to-sign-vectors.json").read_text())


@pytest.mark.parametrize(
    "vector",
    STRING_VECTORS,
    ids=lambda v: v.get("file") or v.get("message_type") or v["source"][:40],
)
def test_string_to_sign_vectors(vector: dict[str, Any]) -> None:
    expected = vector["expected_string_to_sign"].encode()
    message: dict[str, Any]
    if "file" in vector:
        message = load(SNS_FIXTURES / vector["file"])
    elif "message" in vector:
        message = vector["message"]
    else:
        # Only the canonical string is published: rebuild the message from it, in shuffled
        # key order and with the unsigned keys SNS adds, and expect the same string back.
        message = dict(_pairs(vector["expected_string_to_sign"]))
        message.update(
            SignatureVersion="1",
            Signature="x",
            SigningCertURL=TEST_CERT_URL,
            UnsubscribeURL="https://sns.us-east-2.amazonaws.com/?Action=Unsubscribe",
            MessageAttributes={"a": {"Type": "String", "Value": "b"}},
        )
        keys = list(message)
        random.Random(7).shuffle(keys)
        message = {key: message[key] for key in keys}
    assert string_to_sign(message) == expected


def test_string_to_sign_per_type_field_lists() -> None:
    base = {
        "Message": "m",
        "MessageId": "i",
        "Subject": "s",
        "SubscribeURL": "u",
        "Timestamp": "t",
        "Token": "k",
        "TopicArn": "a",
        "UnsubscribeURL": "x",
        "SignatureVersion": "1",
    }
    notification = string_to_sign(dict(base, Type="Notification")).decode()
    assert notification == (
        "Message\nm\nMessageId\ni\nSubject\ns\nTimestamp\nt\nTopicArn\na\nType\nNotification\n"
    )
    for kind in ("SubscriptionConfirmation", "UnsubscribeConfirmation"):
        assert string_to_sign(dict(base, Type=kind)).decode() == (
            "Message\nm\nMessageId\ni\nSubscribeURL\nu\nTimestamp\nt\nToken\nk\n"
            f"TopicArn\na\nType\n{kind}\n"
        )
    null_subject = string_to_sign(dict(base, Type="Notification", Subject=None)).decode()
    assert "Subject" not in null_subject
    with pytest.raises(VerificationFailed):
        string_to_sign(dict(base, Type="Bogus"))
    with pytest.raises(MalformedPayload):
        string_to_sign(dict(base, Type="Notification", Message=["not", "a", "string"]))


CERTURL_VECTORS = json.loads((SNS_FIXTURES / "certurl-vectors.json").read_text())["vectors"]


@pytest.mark.parametrize("vector", CERTURL_VECTORS, ids=lambda v: v["url"])
def test_certurl_vectors(vector: dict[str, Any]) -> None:
    assert is_sns_url(vector["url"], require_pem=True) is vector["expected_accept"]


@pytest.mark.parametrize(
    ("url", "accept"),
    [
        ("https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-x.pem", True),
        ("https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-x.pem", True),
        ("https://SNS.US-EAST-1.AMAZONAWS.COM/SimpleNotificationService-x.pem", True),
        ("https://s3.amazonaws.com/sns/cert.pem", False),
        ("https://sns-certs.s3.amazonaws.com/cert.pem", False),
        ("https://my-bucket.s3.us-east-1.amazonaws.com/cert.pem", False),
        ("https://ec2.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us.amazonaws.com/cert.pem", False),  # region part shorter than 3
        ("https://sns.us-east-1.amazonaws.com.evil.example/cert.pem", False),
        ("https://evil.example/sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com@evil.example/cert.pem", False),
        ("https://user@sns.us-east-1.amazonaws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com:8443/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com:443/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com./cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com/cert.pem?x=.pem", False),
        ("https://sns.us-east-1.amazonaws.com/cert.php?x=.pem", False),
        ("https://sns.us-east-1.amazonaws.com/cert.pem#frag", False),
        ("https://sns.us-east-1.amazonaws.com/cert.pem\n", False),
        ("https://sns.us-east-1.amazon\taws.com/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com\\@evil.example/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com/cert.PEM", False),
        ("https://sns.ü-east-1.amazonaws.com/cert.pem", False),
        ("https://[::1]/cert.pem", False),
        ("https://sns.us-east-1.amazonaws.com:abc/cert.pem", False),
        ("sns.us-east-1.amazonaws.com/cert.pem", False),
        ("", False),
    ],
)
def test_cert_url_edge_cases(url: str, accept: bool) -> None:
    assert is_sns_url(url, require_pem=True) is accept


def test_is_sns_url_without_pem_requirement() -> None:
    confirm = "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&Token=abc"
    assert is_sns_url(confirm)
    assert not is_sns_url(confirm, require_pem=True)
    assert not is_sns_url("http://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription")
    assert not is_sns_url(None)  # type: ignore[arg-type]


# --- messages signed at test time --------------------------------------------------------

TYPES = ["Notification", "SubscriptionConfirmation", "UnsubscribeConfirmation"]


@pytest.mark.parametrize("version", ["1", "2"])
@pytest.mark.parametrize("kind", TYPES)
async def test_test_ca_signed_messages_verify(
    verifier: SnsVerifier, host: FakeCertHost, kind: str, version: str
) -> None:
    message = sign_sns(sns_message(kind, message="hello\nworld ✓"), version=version)  # type: ignore[arg-type]
    envelope = await verifier.verify(sns_body(message))
    assert (envelope.type, envelope.message_id, envelope.message) == (
        kind,
        message["MessageId"],
        "hello\nworld ✓",
    )
    if kind == "Notification":
        assert envelope.token is None and envelope.subscribe_url is None
    else:
        assert envelope.token == message["Token"]
        assert envelope.subscribe_url == message["SubscribeURL"]
    assert host.requests == [TEST_CERT_URL]


async def test_body_may_be_str_or_bytes_and_subject_is_kept(verifier: SnsVerifier) -> None:
    message = sign_sns(sns_message(subject="Amazon SES Email Event Notification"), version="2")
    assert (await verifier.verify(json.dumps(message))).subject == message["Subject"]
    assert (await verifier.verify(json.dumps(message).encode())).subject == message["Subject"]


async def test_many_notifications_cause_one_certificate_fetch(host: FakeCertHost) -> None:
    store = cert_fetcher(host)
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    for _ in range(25):
        await verifier.verify(sns_body(sign_sns(sns_message())))
    assert store.fetch_count == 1 and len(host.requests) == 1


@pytest.mark.parametrize(
    "cert_url",
    [
        "https://s3.amazonaws.com/sns-certs/SimpleNotificationService-x.pem",
        "https://attacker-bucket.s3.amazonaws.com/SimpleNotificationService-x.pem",
        "https://sns.us-east-1.amazonaws.com.attacker.example/SimpleNotificationService-x.pem",
        "https://attacker.example/SimpleNotificationService-x.pem",
        "http://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem",
        "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.txt",
    ],
)
async def test_forged_cert_urls_are_refused_without_fetching(
    verifier: SnsVerifier, host: FakeCertHost, cert_url: str
) -> None:
    # The attacker signs with a key whose certificate they can serve themselves.
    body = sns_body(sign_sns(sns_message(), cert_url=cert_url))
    await refused(verifier, body, "cert_url_not_sns")
    assert host.requests == []


async def test_signature_by_another_key_is_refused(verifier: SnsVerifier) -> None:
    impostor = make_leaf(key_slot="impostor")
    body = sns_body(sign_sns(sns_message(), key=impostor.key))
    await refused(verifier, body, "bad_signature")


async def test_certificate_not_for_sns_is_refused() -> None:
    # A certificate served from an SNS URL but issued to someone else.
    other = make_leaf(common_name="attacker.example", dns_names=("attacker.example",), key_slot="x")
    store = cert_fetcher(FakeCertHost(default_pem=other.pem))
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    await refused(verifier, sns_body(sign_sns(sns_message(), key=other.key)), "bad_certificate")


async def test_expired_certificate_is_refused() -> None:
    now = datetime.now(UTC)
    expired = make_leaf(not_before=now - timedelta(days=400), not_after=now - timedelta(days=1))
    store = cert_fetcher(FakeCertHost(default_pem=expired.pem))
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    await refused(
        verifier, sns_body(sign_sns(sns_message(), key=expired.key)), "expired_certificate"
    )
    # The same message verifies with the clock inside the certificate's validity.
    inside = now - timedelta(days=2)
    message = sign_sns(sns_message(timestamp=inside), key=expired.key)
    clocked = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store, clock=lambda: inside)
    assert (await clocked.verify(sns_body(message))).message_id == message["MessageId"]


async def test_not_yet_valid_certificate_is_refused() -> None:
    now = datetime.now(UTC)
    future = make_leaf(not_before=now + timedelta(days=1), not_after=now + timedelta(days=30))
    store = cert_fetcher(FakeCertHost(default_pem=future.pem))
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    await refused(
        verifier, sns_body(sign_sns(sns_message(), key=future.key)), "expired_certificate"
    )


async def test_topic_not_on_the_allow_list_is_refused_before_fetching(
    verifier: SnsVerifier, host: FakeCertHost
) -> None:
    body = sns_body(sign_sns(sns_message(topic_arn=OTHER_TOPIC_ARN)))
    error = await refused(verifier, body, "topic_not_allowed")
    assert OTHER_TOPIC_ARN in str(error)
    assert host.requests == []


async def test_several_topics_may_be_allowed(host: FakeCertHost) -> None:
    verifier = SnsVerifier(
        allowed_topic_arns=[TEST_TOPIC_ARN, OTHER_TOPIC_ARN], certs=cert_fetcher(host)
    )
    for arn in (TEST_TOPIC_ARN, OTHER_TOPIC_ARN):
        assert (
            await verifier.verify(sns_body(sign_sns(sns_message(topic_arn=arn))))
        ).topic_arn == arn
    wrong = sns_message(topic_arn=TEST_TOPIC_ARN.replace("123456789012", "999999999999"))
    await refused(verifier, sns_body(sign_sns(wrong)), "topic_not_allowed")


async def test_empty_allow_list_refuses_everything(host: FakeCertHost) -> None:
    verifier = SnsVerifier(allowed_topic_arns=[], certs=cert_fetcher(host))
    assert not verifier.configured
    await refused(verifier, sns_body(sign_sns(sns_message())), "no_topics_configured")
    await refused(verifier, b"not even json", "no_topics_configured")
    assert host.requests == []
    assert SnsVerifier(allowed_topic_arns=[""], certs=cert_fetcher(host)).configured is False
    assert SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=cert_fetcher(host)).configured


@pytest.mark.parametrize(
    ("age", "max_age", "reason"),
    [
        (timedelta(hours=1, seconds=1), 3600.0, "stale_timestamp"),
        (timedelta(days=3), 3600.0, "stale_timestamp"),
        (timedelta(minutes=6), 300.0, "stale_timestamp"),
        (timedelta(minutes=59), 3600.0, None),
        (timedelta(minutes=4), 300.0, None),
        (timedelta(minutes=-2), 3600.0, None),  # small clock skew is fine
        (timedelta(minutes=-30), 3600.0, "future_timestamp"),
        (timedelta(days=-365), 3600.0, "future_timestamp"),
    ],
)
async def test_message_age(
    host: FakeCertHost, age: timedelta, max_age: float, reason: str | None
) -> None:
    now = datetime.now(UTC)
    verifier = SnsVerifier(
        allowed_topic_arns=[TEST_TOPIC_ARN],
        certs=cert_fetcher(host),
        max_age_seconds=max_age,
        clock=lambda: now,
    )
    body = sns_body(sign_sns(sns_message(timestamp=now - age)))
    if reason is None:
        assert (await verifier.verify(body)).timestamp <= now + timedelta(minutes=5)
    else:
        await refused(verifier, body, reason)
        assert host.requests == []


def _one_ms_later(timestamp: str) -> str:
    last = int(timestamp[-2])
    return timestamp[:-2] + str((last + 1) % 10) + "Z"


def _other_first(value: str) -> str:
    return ("1" if value[0] == "0" else "0") + value[1:]


TAMPERS: list[tuple[str, str, Callable[[dict[str, Any]], None]]] = [
    ("Notification", "message", lambda m: m.update(Message=m["Message"] + " ")),
    # Always a different first character (a random id may already start with "0").
    ("Notification", "message-id", lambda m: m.update(MessageId=_other_first(m["MessageId"]))),
    ("Notification", "subject-added", lambda m: m.update(Subject="hi")),
    ("Notification", "timestamp", lambda m: m.update(Timestamp=_one_ms_later(m["Timestamp"]))),
    (
        "Notification",
        "type",
        lambda m: m.update(
            Type="SubscriptionConfirmation",
            Token="0" * 64,
            SubscribeURL="https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription",
        ),
    ),
    ("SubscriptionConfirmation", "token", lambda m: m.update(Token=m["Token"][::-1])),
    (
        "SubscriptionConfirmation",
        "subscribe-url",
        lambda m: m.update(SubscribeURL=m["SubscribeURL"] + "x"),
    ),
    ("UnsubscribeConfirmation", "type", lambda m: m.update(Type="SubscriptionConfirmation")),
    ("UnsubscribeConfirmation", "message", lambda m: m.update(Message="")),
    ("Notification", "downgrade-v2-to-v1", lambda m: m.update(SignatureVersion="1")),
]


@pytest.mark.parametrize(
    ("kind", "change"), [(k, c) for k, c, _ in TAMPERS], ids=[c for _, c, _ in TAMPERS]
)
async def test_tampered_messages_are_refused(verifier: SnsVerifier, kind: str, change: str) -> None:
    tamper = next(t for k, c, t in TAMPERS if (k, c) == (kind, change))
    message = sign_sns(sns_message(kind), version="2")
    tamper(message)
    await refused(verifier, sns_body(message), "bad_signature")


async def test_removing_the_subject_breaks_the_signature(verifier: SnsVerifier) -> None:
    message = sign_sns(sns_message(subject="Hello"))
    del message["Subject"]
    await refused(verifier, sns_body(message), "bad_signature")
    message = sign_sns(sns_message(subject="Hello"))
    message["Subject"] = None
    await refused(verifier, sns_body(message), "bad_signature")


async def test_unsigned_fields_may_change(verifier: SnsVerifier) -> None:
    # SNS does not sign these (AWS docs), so changing them must not break verification.
    message = sign_sns(sns_message())
    message["UnsubscribeURL"] = "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&x=1"
    message["MessageAttributes"] = {"k": {"Type": "String", "Value": "v"}}
    message["SomethingNew"] = 1
    assert (await verifier.verify(sns_body(message))).raw["SomethingNew"] == 1


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("3", "unsupported_signature_version"),
        ("0", "unsupported_signature_version"),
        ("", "unsupported_signature_version"),
        ("1.0", "unsupported_signature_version"),
        ("SHA256", "unsupported_signature_version"),
        (2, "missing_signature"),
        (None, "missing_signature"),
    ],
)
async def test_wrong_signature_version_is_refused(
    verifier: SnsVerifier, host: FakeCertHost, version: Any, reason: str
) -> None:
    message = sign_sns(sns_message(), version="2")
    message["SignatureVersion"] = version
    await refused(verifier, sns_body(message), reason)
    assert host.requests == []


@pytest.mark.parametrize("signature", ["", "bad", "!!!!", "QUJD", 12, None])
async def test_garbage_signatures_are_refused(verifier: SnsVerifier, signature: Any) -> None:
    message = sign_sns(sns_message())
    message["Signature"] = signature
    with pytest.raises(VerificationFailed) as info:
        await verifier.verify(sns_body(message))
    assert info.value.reason in ("bad_signature", "missing_signature")


async def test_confirmation_with_a_non_sns_subscribe_url_is_refused(
    verifier: SnsVerifier, host: FakeCertHost
) -> None:
    # Validly signed by the (test) SNS key, but the endpoint would GET this URL later.
    message = sns_message(
        "SubscriptionConfirmation", subscribe_url="https://169.254.169.254/latest"
    )
    await refused(verifier, sns_body(sign_sns(message)), "subscribe_url_not_sns")
    assert host.requests == []


async def test_raw_message_delivery_is_refused_with_a_clear_reason(verifier: SnsVerifier) -> None:
    # With RawMessageDelivery the endpoint gets the bare SES event, with no envelope at all.
    vector = load(SNS_FIXTURES / "djangoses-2022-ses-event-complaint-sv1-subject.json")
    ses_event = vector["Message"]
    error = await refused(verifier, ses_event, "raw_message_delivery")
    assert "raw message delivery is not supported" in str(error)
    await refused(verifier, b"{}", "raw_message_delivery")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1, 2, 3]",
        b'"a string"',
        b"42",
        b"null",
        b"\xff\xfe\x00garbage",
        b"{" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"Type": "Notification"',
    ],
    ids=[
        "empty",
        "text",
        "array",
        "string",
        "number",
        "null",
        "binary",
        "open-braces",
        "deep",
        "truncated",
    ],
)
async def test_malformed_bodies_are_400(verifier: SnsVerifier, body: bytes) -> None:
    await refused(verifier, body, "malformed_payload", MalformedPayload)


@pytest.mark.parametrize(
    "change",
    [
        {"MessageId": None},
        {"TopicArn": 5},
        {"Message": {"nested": "object"}},
        {"Timestamp": "yesterday"},
        {"Type": None},
        {"Subject": 3},
    ],
    ids=lambda c: next(iter(c)),
)
async def test_envelope_fields_of_the_wrong_shape_are_400(
    verifier: SnsVerifier, change: dict[str, Any]
) -> None:
    message = sign_sns(sns_message())
    message.update(change)
    await refused(verifier, sns_body(message), "malformed_payload", MalformedPayload)


async def test_confirmation_without_token_is_400(verifier: SnsVerifier) -> None:
    message = sign_sns(sns_message("SubscriptionConfirmation"))
    del message["Token"]
    await refused(verifier, sns_body(message), "malformed_payload", MalformedPayload)


async def test_unknown_message_type_is_refused(verifier: SnsVerifier) -> None:
    message = sign_sns(sns_message())
    message["Type"] = "SomethingElse"
    await refused(verifier, sns_body(message), "unknown_message_type")


async def test_certificate_fetch_failure_is_temporary_and_remembered_briefly() -> None:
    answers = iter([httpx.Response(503), httpx.Response(502)])
    host = FakeCertHost(handler=lambda request: next(answers, None))
    now = [0.0]
    store = cert_fetcher(host, clock=lambda: now[0])
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    body = sns_body(sign_sns(sns_message()))
    for _ in range(2):
        with pytest.raises(TemporaryFailure):
            await verifier.verify(body)
        # the failure is remembered: the retry within the window fetches nothing
        with pytest.raises(TemporaryFailure):
            await verifier.verify(body)
        now[0] += 15
    assert (await verifier.verify(body)).type == "Notification"
    assert len(host.requests) == 3


async def test_failures_are_logged_and_counted(
    verifier: SnsVerifier, caplog: pytest.LogCaptureFixture
) -> None:
    before = value(VERIFICATION_FAILURES, provider="sns", reason="topic_not_allowed")
    caplog.set_level(logging.INFO, logger="gateway.webhooks")
    with pytest.raises(VerificationFailed):
        await verifier.verify(sns_body(sign_sns(sns_message(topic_arn=OTHER_TOPIC_ARN))))
    assert value(VERIFICATION_FAILURES, provider="sns", reason="topic_not_allowed") == before + 1
    lines = [r for r in caplog.records if r.name == "gateway.webhooks"]
    assert len(lines) == 1 and "reason=topic_not_allowed" in lines[0].getMessage()

    caplog.clear()
    counted = total(VERIFICATION_FAILURES)
    with pytest.raises(MalformedPayload):
        await verifier.verify(b"[]")
    assert total(VERIFICATION_FAILURES) == counted  # 400s are logged, not counted
    assert [r.getMessage() for r in caplog.records if r.name == "gateway.webhooks"] != []

    caplog.clear()
    await verifier.verify(sns_body(sign_sns(sns_message())))
    assert [r for r in caplog.records if r.name == "gateway.webhooks"] == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(max_size=300),
    subject=st.one_of(st.none(), st.text(min_size=1, max_size=100)),
    version=st.sampled_from(["1", "2"]),
    kind=st.sampled_from(TYPES),
)
async def test_any_text_round_trips_and_any_change_breaks_it(
    text: str, subject: str | None, version: str, kind: str
) -> None:
    # Non-ASCII, newlines, escapes: whatever JSON carries, the signature covers it exactly.
    store = cert_fetcher()
    verifier = SnsVerifier(allowed_topic_arns=[TEST_TOPIC_ARN], certs=store)
    message = sign_sns(
        sns_message(kind, message=text, subject=subject if kind == "Notification" else None),
        version=version,  # type: ignore[arg-type]
    )
    envelope = await verifier.verify(json.dumps(message, ensure_ascii=bool(len(text) % 2)))
    assert envelope.message == text
    message["Message"] = text + "\n"
    with pytest.raises(VerificationFailed):
        await verifier.verify(json.dumps(message))


def test_certificate_fixture_subjects() -> None:
    # The store's subject rule (CN sns.amazonaws.com) holds for both genuine certificates.
    for pem in (SNS_FIXTURES / "certs").glob("*.pem"):
        certificate = x509.load_pem_x509_certificate(pem.read_bytes())
        cns = [a.value for a in certificate.subject if a.oid == x509.NameOID.COMMON_NAME]
        assert cns == ["sns.amazonaws.com"]


# --- wiring in the composition root ---------------------------------------------------------


async def test_build_services_wires_the_verifiers(settings: Settings) -> None:
    from tests.conftest import replace_settings
    from webhooks.twilio_signature import TwilioVerifier

    assert settings.database_url is not None
    bare = build_services(replace_settings(settings, sns_topic_arns=()), settings.database_url)
    try:
        assert bare.sns_verifier.configured is False
        assert bare.twilio_verifier.configured is False
    finally:
        await bare.close()

    configured = replace_settings(
        settings,
        sns_topic_arns=(TEST_TOPIC_ARN,),
        sns_max_age_seconds=60.0,
        twilio_auth_tokens=("t1",),
        twilio_subaccount_tokens={"AC1": ("t2",)},
    )
    services = build_services(configured, settings.database_url)
    try:
        store = services.cert_store
        verifier = services.sns_verifier
        assert isinstance(store, CertificateStore) and isinstance(verifier, SnsVerifier)
        assert verifier.configured
        assert store.redis_key(TEST_CERT_URL).startswith(settings.redis_prefix + "snscert:")
        assert isinstance(services.twilio_verifier, TwilioVerifier)
        assert services.twilio_verifier.configured
        # The configured maximum age is honoured: a 2-minute-old message is stale.
        old = sns_message(timestamp=datetime.now(UTC) - timedelta(minutes=2))
        await refused(verifier, sns_body(sign_sns(old)), "stale_timestamp")
    finally:
        await services.close()


async def test_install_sns_test_verifier(services: Services) -> None:
    from tests.webhooks.signing import install_sns_test_verifier

    host = install_sns_test_verifier(services)
    verifier = services.sns_verifier
    envelope = await verifier.verify(sns_body(sign_sns(sns_message(), version="2")))
    assert envelope.topic_arn == TEST_TOPIC_ARN and host.requests == [TEST_CERT_URL]
    store = services.cert_store
    assert services.redis is not None
    assert await services.redis.get(store.redis_key(TEST_CERT_URL)) is not None
