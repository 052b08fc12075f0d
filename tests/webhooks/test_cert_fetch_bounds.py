"""Unauthenticated SNS traffic cannot turn the gateway into a certificate-fetch loop.

Issue 11, defect 7: a forged SNS message naming a real-looking SigningCertURL made the
gateway fetch that certificate on every request (and answer 503 when the fetch failed).
The certificate host is faked at the transport seam (`FakeCertHost`), which counts fetches.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx

from gateway.services import Services
from tests.webhooks.signing import (
    FakeCertHost,
    install_sns_test_verifier,
    sign_sns,
    sns_body,
    sns_message,
)

SES_PATH = "/webhooks/ses"
SNS_HEADERS = {"Content-Type": "text/plain; charset=UTF-8"}


def forged(cert_url: str) -> bytes:
    """An SNS notification for the allowed topic, fresh, naming `cert_url` (the signature is
    never checked: the certificate cannot be had)."""
    return sns_body(sign_sns(sns_message(), cert_url=cert_url))


def cert_url(name: str) -> str:
    return f"https://sns.us-east-1.amazonaws.com/SimpleNotificationService-{name}.pem"


async def test_a_failing_certificate_url_is_fetched_once_for_many_forged_messages(
    services: Services, client: httpx.AsyncClient
) -> None:
    host = install_sns_test_verifier(
        services, host=FakeCertHost(handler=lambda request: httpx.Response(503))
    )
    url = cert_url(uuid.uuid4().hex)
    for _ in range(20):
        response = await client.post(SES_PATH, content=forged(url), headers=SNS_HEADERS)
        assert response.status_code == 503, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert int(response.headers["retry-after"]) > 0
    assert host.requests == [url]


async def test_a_refused_certificate_url_is_remembered(
    services: Services, client: httpx.AsyncClient
) -> None:
    host = install_sns_test_verifier(
        services, host=FakeCertHost(handler=lambda request: httpx.Response(404))
    )
    url = cert_url(uuid.uuid4().hex)
    for _ in range(10):
        response = await client.post(SES_PATH, content=forged(url), headers=SNS_HEADERS)
        assert response.status_code == 403, response.text
    assert host.requests == [url]


async def test_concurrent_fetches_are_bounded_under_a_flood_of_distinct_urls(
    services: Services, client: httpx.AsyncClient
) -> None:
    # A certificate host that never answers (until the end of the test): every fetch takes
    # the whole timeout. Distinct URLs defeat any per-URL cache; the fetch slots do not.
    gate = asyncio.Event()
    host = install_sns_test_verifier(services, host=FakeCertHost(gate=gate))
    store = services.cert_store
    try:
        responses = await asyncio.gather(
            *(
                client.post(SES_PATH, content=forged(cert_url(f"flood-{i}")), headers=SNS_HEADERS)
                for i in range(12)
            )
        )
    finally:
        gate.set()
    assert all(r.status_code == 503 for r in responses), [r.status_code for r in responses]
    assert all(int(r.headers["retry-after"]) > 0 for r in responses)
    reasons = sorted(r.json()["reason"] for r in responses)
    assert reasons.count("cert_fetch_busy") == 8
    assert len(host.requests) == 4 and store.fetch_count == 4
