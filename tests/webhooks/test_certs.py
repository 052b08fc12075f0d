"""The SNS certificate store: fetch rules, PEM checks, cache bounds, Redis sharing, TLS trust."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from redis.asyncio import Redis

from tests.webhooks.signing import (
    SNS_FIXTURES,
    FakeCertHost,
    cert_fetcher,
    make_leaf,
    signing_ca,
    sns_leaf,
)
from webhooks.certs import MAX_CERT_BYTES, CertificateStore, default_ssl_context, parse_certificate
from webhooks.errors import TemporaryFailure, VerificationFailed

URL_A = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-a.pem"
URL_B = "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-b.pem"
URL_C = "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-c.pem"
GENUINE_URL = "https://sns.us-east-2.amazonaws.com/SimpleNotificationService-7ff5318490ec183fbaddaa2a969abfda.pem"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def read(path: Path) -> bytes:
    return path.read_bytes()


async def test_fetches_and_parses_the_genuine_certificate() -> None:
    host = FakeCertHost(default_pem=None)
    store = cert_fetcher(host)
    certificate = await store.get(GENUINE_URL)
    expected = read(SNS_FIXTURES / "certs" / GENUINE_URL.rsplit("/", 1)[1])
    assert certificate == parse_certificate(expected)
    assert hashlib.sha256(certificate.public_bytes(Encoding.DER)).hexdigest() == (
        "d03829b46e82c5fd1c2d241093215b2e7469a81e16c05777e7c722a36e0cb2a5"  # PROVENANCE.md
    )
    assert (await store.get(GENUINE_URL)) is certificate
    assert store.fetch_count == 1 and host.requests == [GENUINE_URL]


async def test_refuses_non_sns_urls_without_any_request() -> None:
    host = FakeCertHost()
    store = cert_fetcher(host)
    for url in (
        "https://s3.amazonaws.com/x.pem",
        "http://sns.us-east-1.amazonaws.com/x.pem",
        "https://sns.us-east-1.amazonaws.com/x.crt",
        "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
    ):
        with pytest.raises(VerificationFailed) as info:
            await store.get(url)
        assert info.value.reason == "cert_url_not_sns"
    assert host.requests == [] and store.fetch_count == 0


async def _until(condition: Callable[[], bool]) -> None:
    """Let the event loop run until `condition` holds (bounded: fails instead of hanging)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def test_concurrent_requests_share_one_fetch() -> None:
    host = FakeCertHost(gate=asyncio.Event())
    store = cert_fetcher(host)
    waiters = [asyncio.ensure_future(store.get(URL_A)) for _ in range(20)]
    await _until(lambda: len(host.requests) == 1)
    await asyncio.sleep(0)  # let every waiter reach the shared fetch
    assert host.gate is not None
    host.gate.set()
    results = await asyncio.gather(*waiters)
    assert all(r is results[0] for r in results)
    assert store.fetch_count == 1 and host.requests == [URL_A]


async def test_a_cancelled_waiter_does_not_cancel_the_shared_fetch() -> None:
    gate = asyncio.Event()
    host = FakeCertHost(gate=gate)
    store = cert_fetcher(host)
    first = asyncio.ensure_future(store.get(URL_A))
    second = asyncio.ensure_future(store.get(URL_A))
    await _until(lambda: len(host.requests) == 1)
    first.cancel()
    await asyncio.sleep(0)
    gate.set()
    assert (await second).subject == sns_leaf().certificate.subject
    assert first.cancelled() and store.fetch_count == 1


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_concurrent_failures_are_shared_and_remembered_briefly() -> None:
    gate = asyncio.Event()
    answers = iter([httpx.Response(503)])
    host = FakeCertHost(gate=gate, handler=lambda request: next(answers, None))
    clock = Clock()
    store = cert_fetcher(host, clock=clock)
    waiters = [asyncio.ensure_future(store.get(URL_A)) for _ in range(5)]
    await _until(lambda: len(host.requests) == 1)
    gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, TemporaryFailure) for r in results)
    assert store.fetch_count == 1
    # Remembered for the short temporary-failure window: no request meanwhile.
    with pytest.raises(TemporaryFailure) as info:
        await store.get(URL_A)
    assert info.value.reason == "cert_fetch_failed"
    assert store.fetch_count == 1
    clock.now += 15
    assert (await store.get(URL_A)).subject == sns_leaf().certificate.subject
    assert store.fetch_count == 2


async def test_a_failing_url_is_fetched_once_a_minute_whatever_the_traffic() -> None:
    # Issue 11, defect 7: forged SNS messages naming a real-looking certificate URL made the
    # gateway fetch it on every request.
    host = FakeCertHost(handler=lambda request: httpx.Response(404))
    clock = Clock()
    store = cert_fetcher(host, clock=clock)
    for _ in range(50):
        with pytest.raises(VerificationFailed) as info:
            await store.get(URL_A)
        assert info.value.reason == "cert_unavailable"
    assert host.requests == [URL_A]
    # per URL: another URL is still fetched
    with pytest.raises(VerificationFailed):
        await store.get(URL_B)
    assert host.requests == [URL_A, URL_B]
    clock.now += 59
    with pytest.raises(VerificationFailed):
        await store.get(URL_A)
    assert len(host.requests) == 2
    clock.now += 1
    with pytest.raises(VerificationFailed):
        await store.get(URL_A)
    assert host.requests == [URL_A, URL_B, URL_A]


async def test_remembered_failures_are_bounded() -> None:
    host = FakeCertHost(handler=lambda request: httpx.Response(404))
    store = cert_fetcher(host, max_failures=2)
    for url in (URL_A, URL_B, URL_C):
        with pytest.raises(VerificationFailed):
            await store.get(url)
    with pytest.raises(VerificationFailed):
        await store.get(URL_A)  # the oldest was forgotten: fetched again
    with pytest.raises(VerificationFailed):
        await store.get(URL_C)  # still remembered
    assert host.requests == [URL_A, URL_B, URL_C, URL_A]


async def test_concurrent_fetches_are_bounded_and_the_excess_is_told_to_retry() -> None:
    gate = asyncio.Event()
    host = FakeCertHost(gate=gate)
    store = cert_fetcher(host, max_concurrent_fetches=2, fetch_wait_seconds=0.05)
    urls = [
        f"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-{i}.pem" for i in range(8)
    ]
    waiters = [asyncio.ensure_future(store.get(url)) for url in urls]
    refused = await asyncio.gather(*waiters[2:], return_exceptions=True)
    assert all(isinstance(r, TemporaryFailure) and r.reason == "cert_fetch_busy" for r in refused)
    assert len(host.requests) == 2 and store.fetch_count == 2
    gate.set()
    for got in await asyncio.gather(*waiters[:2]):
        assert got.subject == sns_leaf().certificate.subject
    # being busy is not remembered against the URL: it is fetched once a slot is free
    assert (await store.get(urls[5])).subject == sns_leaf().certificate.subject
    assert store.fetch_count == 3


async def test_ttl_expiry_refetches() -> None:
    host = FakeCertHost()
    store = cert_fetcher(host, ttl_seconds=0)
    await store.get(URL_A)
    await store.get(URL_A)
    assert store.fetch_count == 2
    cached = cert_fetcher(FakeCertHost(), ttl_seconds=3600)
    for _ in range(5):
        await cached.get(URL_A)
    assert cached.fetch_count == 1


async def test_cache_is_bounded_and_keeps_recently_used_entries() -> None:
    host = FakeCertHost()
    store = cert_fetcher(host, max_entries=2)
    await store.get(URL_A)
    await store.get(URL_B)
    await store.get(URL_A)  # A is now the most recently used
    await store.get(URL_C)  # evicts B
    assert store.fetch_count == 3
    await store.get(URL_A)
    await store.get(URL_C)
    assert store.fetch_count == 3
    await store.get(URL_B)
    assert store.fetch_count == 4
    assert host.requests == [URL_A, URL_B, URL_C, URL_B]


async def test_shared_through_redis(redis: Redis) -> None:
    prefix = f"gwtest:{uuid.uuid4().hex[:8]}:"
    first_host, second_host = FakeCertHost(), FakeCertHost()
    first = cert_fetcher(first_host, redis=redis, redis_prefix=prefix, ttl_seconds=600)
    second = cert_fetcher(second_host, redis=redis, redis_prefix=prefix, ttl_seconds=600)
    try:
        certificate = await first.get(URL_A)
        key = f"{prefix}snscert:{hashlib.sha256(URL_A.encode()).hexdigest()}"
        assert first.redis_key(URL_A) == key
        assert await redis.get(key) == sns_leaf().pem
        assert 0 < await redis.ttl(key) <= 600

        assert (await second.get(URL_A)) == certificate
        assert second.fetch_count == 0 and second_host.requests == []
        assert first.fetch_count == 1
    finally:
        await redis.delete(first.redis_key(URL_A))


async def test_unusable_redis_entry_is_replaced(redis: Redis) -> None:
    prefix = f"gwtest:{uuid.uuid4().hex[:8]}:"
    store = cert_fetcher(redis=redis, redis_prefix=prefix)
    key = store.redis_key(URL_A)
    try:
        await redis.set(key, b"<html>not a certificate</html>")
        assert (await store.get(URL_A)).subject == sns_leaf().certificate.subject
        assert store.fetch_count == 1
        assert await redis.get(key) == sns_leaf().pem
    finally:
        await redis.delete(key)


async def test_redis_outage_falls_back_to_fetching() -> None:
    broken = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        store = cert_fetcher(redis=broken)
        assert (await store.get(URL_A)).subject == sns_leaf().certificate.subject
        assert store.fetch_count == 1
    finally:
        await broken.aclose()


async def test_redirects_are_not_followed() -> None:
    host = FakeCertHost(
        handler=lambda request: (
            httpx.Response(302, headers={"Location": URL_B}) if str(request.url) == URL_A else None
        )
    )
    store = cert_fetcher(host)
    with pytest.raises(VerificationFailed) as info:
        await store.get(URL_A)
    assert info.value.reason == "cert_unavailable"
    assert host.requests == [URL_A]


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        (404, VerificationFailed, "cert_unavailable"),
        (403, VerificationFailed, "cert_unavailable"),
        (204, VerificationFailed, "cert_unavailable"),
        (429, TemporaryFailure, "cert_fetch_failed"),
        (500, TemporaryFailure, "cert_fetch_failed"),
        (503, TemporaryFailure, "cert_fetch_failed"),
    ],
)
async def test_http_errors(status: int, error: type[Exception], reason: str) -> None:
    store = cert_fetcher(FakeCertHost(handler=lambda request: httpx.Response(status)))
    with pytest.raises(error) as info:
        await store.get(URL_A)
    assert info.value.reason == reason  # type: ignore[attr-defined]


async def test_connection_errors_are_temporary() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    store = cert_fetcher(FakeCertHost(handler=refuse))
    with pytest.raises(TemporaryFailure) as info:
        await store.get(URL_A)
    assert info.value.reason == "cert_fetch_failed"


async def test_slow_certificate_host_times_out() -> None:
    store = cert_fetcher(FakeCertHost(delay=5.0), timeout_seconds=0.05)
    with pytest.raises(TemporaryFailure) as info:
        await store.get(URL_A)
    assert info.value.reason == "cert_fetch_timeout"


def _ec_certificate_pem() -> bytes:
    # An SNS-named certificate with an EC key: SNS signs with RSA only.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    ca = signing_ca()
    leaf = sns_leaf().certificate
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
        .sign(ca.key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


BAD_BODIES: dict[str, Callable[[], bytes]] = {
    "ruby-extra-content": lambda: read(
        SNS_FIXTURES / "invalid" / "ruby-cert-body-with-extra-content.txt"
    ),
    "two-certificates": lambda: sns_leaf().pem + signing_ca().pem,
    "html": lambda: b"<html><body>Service Unavailable</body></html>",
    "empty": lambda: b"",
    "garbage-in-pem-armour": lambda: (
        b"-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE-----\n"
    ),
    "private-key": lambda: b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    "not-for-sns": lambda: make_leaf(common_name="attacker.example", dns_names=()).pem,
    "ca-certificate": lambda: signing_ca().pem,
    "ec-key": _ec_certificate_pem,
    "binary": lambda: bytes(range(256)),
    "too-large": lambda: sns_leaf().pem + b" " * MAX_CERT_BYTES,
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
async def test_unacceptable_certificate_bodies(name: str) -> None:
    body = BAD_BODIES[name]()
    store = cert_fetcher(FakeCertHost(handler=lambda request: httpx.Response(200, content=body)))
    with pytest.raises(VerificationFailed) as info:
        await store.get(URL_A)
    assert info.value.reason == "bad_certificate"


def test_pem_with_surrounding_whitespace_is_fine() -> None:
    pem = b"\n\n" + read(SNS_FIXTURES / "certs" / GENUINE_URL.rsplit("/", 1)[1]) + b"\r\n"
    assert parse_certificate(pem).serial_number > 0


def test_both_genuine_certificates_parse() -> None:
    for path in (SNS_FIXTURES / "certs").glob("*.pem"):
        assert (
            parse_certificate(read(path))
            .subject.rfc4514_string()
            .startswith("CN=sns.amazonaws.com")
        )


# --- TLS: the default transport trusts the standard CA bundle, SSL_CERT_FILE honoured -----


class TlsCertHost:
    """A real HTTPS server on a unix socket presenting "sns.us-east-1.amazonaws.com"."""

    def __init__(self, socket_path: Path, tmp: Path) -> None:
        leaf = make_leaf(
            common_name="sns.us-east-1.amazonaws.com",
            dns_names=("sns.us-east-1.amazonaws.com",),
            key_slot="tls-server",
        )
        from cryptography.hazmat.primitives import serialization

        cert_file, key_file = tmp / "server.pem", tmp / "server.key"
        cert_file.write_bytes(leaf.pem)
        key_file.write_bytes(
            leaf.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert_file, key_file)
        self.socket_path = socket_path
        self.server: asyncio.AbstractServer | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = sns_leaf().pem
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-pem-file\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client refused our certificate
        finally:
            writer.close()

    async def __aenter__(self) -> TlsCertHost:
        self.server = await asyncio.start_unix_server(
            self._handle, path=str(self.socket_path), ssl=self.context
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def trusted_names(context: ssl.SSLContext) -> list[str]:
    """Common names of the CA certificates `context` trusts."""
    names = []
    for certificate in context.get_ca_certs():
        for rdn in certificate["subject"]:
            for key, value in rdn:  # type: ignore[str-unpack]
                if key == "commonName":
                    names.append(value)
    return names


@pytest.fixture
def ca_bundle(tmp_path: Path) -> Path:
    path = tmp_path / "test-ca.pem"
    path.write_bytes(signing_ca().pem)
    return path


def test_default_ssl_context_honours_ssl_cert_file(
    ca_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_bundle))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    assert "Gateway Test Root CA" in trusted_names(default_ssl_context())
    monkeypatch.delenv("SSL_CERT_FILE")
    assert "Gateway Test Root CA" not in trusted_names(default_ssl_context())


async def test_real_tls_fetch_trusts_ssl_cert_file_only(
    ca_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A unix-socket transport lets real TLS run against "sns.us-east-1.amazonaws.com"
    # without DNS or network; the TLS context is the one the store uses by default.
    # (unix socket paths are limited to ~100 bytes: keep it short, not under tmp_path)
    with tempfile.TemporaryDirectory(prefix="gwsns") as short:
        socket_path = Path(short) / "s.sock"
        url = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-tls.pem"
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        async with TlsCertHost(socket_path, tmp_path):
            monkeypatch.setenv("SSL_CERT_FILE", str(ca_bundle))
            trusted = CertificateStore(
                transport=httpx.AsyncHTTPTransport(
                    verify=default_ssl_context(), uds=str(socket_path)
                )
            )
            assert (await trusted.get(url)).subject == sns_leaf().certificate.subject

            monkeypatch.delenv("SSL_CERT_FILE")
            untrusted = CertificateStore(
                transport=httpx.AsyncHTTPTransport(
                    verify=default_ssl_context(), uds=str(socket_path)
                )
            )
            with pytest.raises(TemporaryFailure) as info:
                await untrusted.get(url)
            assert info.value.reason == "cert_fetch_failed"


async def test_default_store_uses_the_standard_tls_context(
    ca_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without an injected transport the store builds its own, from default_ssl_context().
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_bundle))
    store = CertificateStore()
    client = store._client()
    try:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert "Gateway Test Root CA" in trusted_names(pool._ssl_context)
        assert client.follow_redirects is False
    finally:
        await client.aclose()
