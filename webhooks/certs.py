"""SNS signing-certificate fetcher with a bounded, TTL'd cache (optionally shared via Redis).

`CertificateStore.get(url)` returns the parsed certificate for an SNS ``SigningCertURL``:

* only URLs passing `is_sns_url(url, require_pem=True)` are ever fetched;
* fetched with httpx: short timeout (connect, read and overall), no redirects, at most
  `MAX_CERT_BYTES`, TLS verified with the standard CA bundle (``SSL_CERT_FILE`` /
  ``SSL_CERT_DIR`` honoured, else certifi);
* the body must be exactly one PEM certificate (nothing around it), whose subject CN is
  ``sns.amazonaws.com`` (or an SNS host name) and whose key is RSA;
* cached in process (LRU, `max_entries`, `ttl_seconds`) and, with a Redis client, as PEM under
  ``<redis_prefix>snscert:<sha256(url)>`` with the same TTL, so N notifications on M
  processes cause one fetch; concurrent requests for one URL share a single fetch.

Failures: a timeout, a connection or TLS error, or a 5xx/429 from the certificate host raise
`TemporaryFailure` (SNS then retries); a 3xx/4xx answer or a body that is not an acceptable
certificate raise `VerificationFailed` (``cert_unavailable`` / ``bad_certificate``). Redis
errors are logged and ignored (the store falls back to fetching).

Anyone can post an SNS-shaped message naming a real-looking certificate URL, and the fetch
happens before the signature can be checked, so unauthenticated traffic must not be able to
turn the gateway into a fetch loop:

* failures are remembered per URL (negative cache, LRU of `max_failures` URLs): the same
  error is raised again without a request for `failure_ttl_seconds` (60 s) after a
  definitive failure, `temporary_failure_ttl_seconds` (15 s) after a temporary one (shorter
  than the 20 s between SNS's own retries, so a genuine retry after a blip fetches again);
* at most `max_concurrent_fetches` fetches run at once in a process; a fetch that finds
  no free slot within `fetch_wait_seconds` is refused with `TemporaryFailure`
  (``cert_fetch_busy``: 503 with Retry-After, SNS retries) and is not remembered.
The certificate's validity period is checked by the verifier against its injectable clock,
not here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from redis.asyncio import Redis
from redis.exceptions import RedisError

from webhooks.errors import TemporaryFailure, VerificationFailed, WebhookError
from webhooks.sns import SNS_HOST_PATTERN, is_sns_url

__all__ = ["MAX_CERT_BYTES", "CertificateStore", "default_ssl_context"]

log = logging.getLogger("gateway.webhooks")

# Real SNS signing certificates are about 2 kB of PEM; anything much larger is not one.
MAX_CERT_BYTES = 64 * 1024
SNS_CERT_COMMON_NAME = "sns.amazonaws.com"
_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
_PEM_END = b"-----END CERTIFICATE-----"


def default_ssl_context() -> ssl.SSLContext:
    """The TLS context used for certificate fetches: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` if set."""
    return httpx.create_ssl_context(verify=True, trust_env=True)


class CertificateStore:
    """Fetches and caches SNS signing certificates by URL (see the module docstring)."""

    def __init__(
        self,
        *,
        redis: Redis | None = None,
        redis_prefix: str = "gw:",
        ttl_seconds: float = 3600,
        max_entries: int = 64,
        timeout_seconds: float = 3.0,
        transport: httpx.AsyncBaseTransport | None = None,
        failure_ttl_seconds: float = 60.0,
        temporary_failure_ttl_seconds: float = 15.0,
        max_failures: int = 1024,
        max_concurrent_fetches: int = 4,
        fetch_wait_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._redis_prefix = redis_prefix
        self._ttl = ttl_seconds
        self._max_entries = max(1, max_entries)
        self._timeout = timeout_seconds
        self._transport = transport
        self._ssl: ssl.SSLContext | None = None
        self._cache: OrderedDict[str, tuple[float, x509.Certificate]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[x509.Certificate]] = {}
        self._failure_ttl = failure_ttl_seconds
        self._temporary_failure_ttl = temporary_failure_ttl_seconds
        self._max_failures = max(1, max_failures)
        # url -> (remembered until, the failure): raised again without a request.
        self._failures: OrderedDict[str, tuple[float, WebhookError]] = OrderedDict()
        self._fetch_slots = asyncio.Semaphore(max(1, max_concurrent_fetches))
        self._fetch_wait = fetch_wait_seconds
        self._clock = clock
        self.fetch_count = 0

    def redis_key(self, url: str) -> str:
        """The Redis key under which the PEM for `url` is shared."""
        return f"{self._redis_prefix}snscert:{hashlib.sha256(url.encode('utf-8')).hexdigest()}"

    async def get(self, url: str) -> x509.Certificate:
        """The certificate at `url` (cached); raises VerificationFailed or TemporaryFailure."""
        if not is_sns_url(url, require_pem=True):
            raise VerificationFailed(
                "SigningCertURL is not an https .pem URL on an SNS host of AWS",
                reason="cert_url_not_sns",
            )
        cached = self._cache.get(url)
        if cached is not None:
            expires, certificate = cached
            if time.monotonic() < expires:
                self._cache.move_to_end(url)
                return certificate
            del self._cache[url]
        remembered = self._failures.get(url)
        if remembered is not None:
            until, error = remembered
            if self._clock() < until:
                # A fresh exception of the same kind: no request, no shared traceback.
                raise type(error)(error.message, reason=error.reason)
            del self._failures[url]
        task = self._inflight.get(url)
        if task is None:
            task = asyncio.create_task(self._load(url))
            self._inflight[url] = task
            task.add_done_callback(lambda done: self._load_done(url, done))
        # shield: one caller giving up (client disconnect) must not cancel the others' fetch.
        return await asyncio.shield(task)

    def clear(self) -> None:
        """Forget the in-process caches, failures too (Redis entries expire on their own)."""
        self._cache.clear()
        self._failures.clear()

    def _load_done(self, url: str, task: asyncio.Task[x509.Certificate]) -> None:
        if self._inflight.get(url) is task:
            del self._inflight[url]
        if not task.cancelled():
            task.exception()  # mark retrieved even when every waiter went away

    async def _load(self, url: str) -> x509.Certificate:
        pem = await self._from_redis(url)
        certificate = None
        if pem is not None:
            try:
                certificate = parse_certificate(pem)
            except VerificationFailed:
                log.warning("discarding an unusable shared SNS certificate for %s", url)
        if certificate is None:
            try:
                pem = await self._fetch(url)
                certificate = parse_certificate(pem)
            except (VerificationFailed, TemporaryFailure) as error:
                self._remember_failure(url, error)
                raise
            await self._to_redis(url, pem)
        self._cache[url] = (time.monotonic() + self._ttl, certificate)
        self._cache.move_to_end(url)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return certificate

    def _remember_failure(self, url: str, error: WebhookError) -> None:
        if error.reason == "cert_fetch_busy":
            return  # our own load shedding says nothing about the URL
        temporary = isinstance(error, TemporaryFailure)
        ttl = self._temporary_failure_ttl if temporary else self._failure_ttl
        if ttl <= 0:
            return
        self._failures[url] = (self._clock() + ttl, error)
        self._failures.move_to_end(url)
        while len(self._failures) > self._max_failures:
            self._failures.popitem(last=False)

    async def _fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self._fetch_wait):
                await self._fetch_slots.acquire()
        except TimeoutError:
            raise TemporaryFailure(
                "too many SNS certificate fetches under way", reason="cert_fetch_busy"
            ) from None
        try:
            return await self._fetch_now(url)
        finally:
            self._fetch_slots.release()

    async def _fetch_now(self, url: str) -> bytes:
        self.fetch_count += 1
        try:
            async with asyncio.timeout(self._timeout):
                async with self._client() as client:
                    async with client.stream("GET", url) as response:
                        status = response.status_code
                        if status >= 500 or status == 429:
                            raise TemporaryFailure(
                                f"certificate host answered {status}", reason="cert_fetch_failed"
                            )
                        if status != 200:
                            # Includes 3xx: redirects are never followed.
                            raise VerificationFailed(
                                f"certificate host answered {status}", reason="cert_unavailable"
                            )
                        body = bytearray()
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_CERT_BYTES:
                                raise VerificationFailed(
                                    "certificate body is too large", reason="bad_certificate"
                                )
                        return bytes(body)
        except TimeoutError:
            raise TemporaryFailure(
                f"certificate fetch timed out after {self._timeout} s", reason="cert_fetch_timeout"
            ) from None
        except httpx.HTTPError as error:
            raise TemporaryFailure(
                f"certificate fetch failed: {type(error).__name__}", reason="cert_fetch_failed"
            ) from None

    def _client(self) -> httpx.AsyncClient:
        kwargs: dict[str, Any] = {}
        if self._transport is not None:
            kwargs["transport"] = self._transport
        else:
            # httpx builds the transport itself (and honours HTTPS_PROXY/NO_PROXY from the
            # environment); TLS trust is the standard bundle, SSL_CERT_FILE/SSL_CERT_DIR first.
            if self._ssl is None:
                self._ssl = default_ssl_context()
            kwargs["verify"] = self._ssl
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout),
            follow_redirects=False,
            trust_env=True,
            headers={"Accept": "application/x-pem-file, */*;q=0.5"},
            **kwargs,
        )

    async def _from_redis(self, url: str) -> bytes | None:
        if self._redis is None:
            return None
        try:
            value = await self._redis.get(self.redis_key(url))
        except (RedisError, OSError) as error:
            log.warning("SNS certificate cache read failed: %s", type(error).__name__)
            return None
        if value is None:
            return None
        return value.encode("ascii", "replace") if isinstance(value, str) else bytes(value)

    async def _to_redis(self, url: str, pem: bytes) -> None:
        if self._redis is None:
            return
        try:
            await self._redis.set(self.redis_key(url), pem, ex=max(1, int(self._ttl)))
        except (RedisError, OSError) as error:
            log.warning("SNS certificate cache write failed: %s", type(error).__name__)


def parse_certificate(pem: bytes) -> x509.Certificate:
    """Parse a body that must be exactly one PEM certificate for SNS with an RSA key.

    Raises `VerificationFailed(reason="bad_certificate")` otherwise. Surrounding text is
    refused on purpose: a lenient PEM reader would pull a certificate out of any page.
    """
    body = pem.strip()
    if (
        not body.startswith(_PEM_BEGIN)
        or not body.endswith(_PEM_END)
        or body.count(b"-----BEGIN") != 1
    ):
        raise VerificationFailed(
            "certificate body is not exactly one PEM certificate", reason="bad_certificate"
        )
    try:
        certificate = x509.load_pem_x509_certificate(body)
    except ValueError:
        raise VerificationFailed(
            "certificate body does not parse", reason="bad_certificate"
        ) from None
    names = [
        attr.value
        for attr in certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if isinstance(attr.value, str)
    ]
    if not any(name == SNS_CERT_COMMON_NAME or SNS_HOST_PATTERN.match(name) for name in names):
        raise VerificationFailed(
            "certificate subject is not sns.amazonaws.com", reason="bad_certificate"
        )
    if not isinstance(certificate.public_key(), rsa.RSAPublicKey):
        raise VerificationFailed("certificate key is not RSA", reason="bad_certificate")
    return certificate
