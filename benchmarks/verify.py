"""Micro-benchmark of webhook verification (not a test): SNS and Twilio, per request.

Run: ``.venv/bin/python benchmarks/verify.py [--n 2000] [--reps 5]``. Prints the median over
`reps` of the mean time per call, next to the raw floors it should be compared with
(/work/shared/perf FLOORS §7: RSA-2048 verify ~28.5 µs, ~34 µs with the canonical string;
Twilio `RequestValidator.validate` with 15 params 82 µs as a dict, 51 µs as a multi-dict).

The SNS cases use a genuine AWS vector (SignatureVersion 1 and 2) with the clock set inside
its certificate's validity; the certificate comes from the fixtures through an in-memory
httpx transport and is cached after the first call, as in production.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from litestar.datastructures import FormMultiDict
from twilio.request_validator import RequestValidator

from webhooks.certs import CertificateStore
from webhooks.sns import SnsVerifier, string_to_sign
from webhooks.twilio_signature import TwilioVerifier

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sns"
VECTORS = {
    "1": FIXTURES / "awsphp-2022-notification-sv1-subject.json",
    "2": FIXTURES / "awsphp-2022-notification-sv2-subject.json",
}


def serve_fixture_certs(request: httpx.Request) -> httpx.Response:
    name = request.url.path.rsplit("/", 1)[-1]
    path = FIXTURES / "certs" / name
    return httpx.Response(200, content=path.read_bytes()) if path.exists() else httpx.Response(404)


def timed(n: int, reps: int, call: Callable[[], object]) -> float:
    """Median over reps of the mean seconds per call."""
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            call()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


async def timed_async(n: int, reps: int, call: Callable[[], Awaitable[object]]) -> float:
    """Median over reps of the mean seconds per awaited call."""
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(n):
            await call()
        samples.append((time.perf_counter() - start) / n)
    return statistics.median(samples)


def _at(when: datetime) -> datetime:
    return when


def _rsa_floor(
    key: rsa.RSAPublicKey,
    signature: bytes,
    message: dict[str, Any],
    algorithm: hashes.HashAlgorithm,
) -> None:
    key.verify(signature, string_to_sign(message), padding.PKCS1v15(), algorithm)


def row(name: str, seconds: float) -> None:
    print(f"{name:<58} {seconds * 1e6:8.1f} µs   {1 / seconds:10,.0f} /s")


async def bench_sns(n: int, reps: int) -> None:
    store = CertificateStore(transport=httpx.MockTransport(serve_fixture_certs))
    for version, path in VECTORS.items():
        body = path.read_bytes()
        message = json.loads(body)
        at = datetime.fromisoformat(message["Timestamp"])
        verifier = SnsVerifier(
            allowed_topic_arns=[message["TopicArn"]], certs=store, clock=functools.partial(_at, at)
        )
        await verifier.verify(body)  # warm the certificate cache
        row(
            f"SNS v{version}: SnsVerifier.verify (cached cert)",
            await timed_async(n, reps, functools.partial(verifier.verify, body)),
        )
        certificate = await store.get(message["SigningCertURL"])
        key = certificate.public_key()
        assert isinstance(key, rsa.RSAPublicKey)
        signature = base64.b64decode(message["Signature"])
        algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()  # noqa: S303 (SNS v1)
        row(
            f"SNS v{version}: floor, RSA verify + string_to_sign",
            timed(n, reps, functools.partial(_rsa_floor, key, signature, message, algorithm)),
        )
    print(f"   (certificate fetches: {store.fetch_count})")


def bench_twilio(n: int, reps: int) -> None:
    token = "f" * 32
    url = "https://gateway.example/webhooks/twilio/status?d=0123456789abcdef"
    params = {f"Param{i:02d}": f"value-{i}" for i in range(13)}
    params.update(MessageSid="SM" + "a" * 32, AccountSid="AC" + "b" * 32)  # 15 params
    signature = RequestValidator(token).compute_signature(url, params)
    multi = FormMultiDict(list(params.items()))
    verifier = TwilioVerifier(auth_tokens=[token])
    rotated = TwilioVerifier(auth_tokens=["0" * 32, token])

    def check(v: TwilioVerifier, p: Mapping[str, str]) -> None:
        v.verify(
            url=url,
            params=p,
            raw_body=None,
            signature=signature,
            account_sid=None,
            content_type="application/x-www-form-urlencoded",
        )

    row(
        "Twilio: TwilioVerifier.verify, 15 params, dict",
        timed(n, reps, lambda: check(verifier, params)),
    )
    row(
        "Twilio: TwilioVerifier.verify, FormMultiDict",
        timed(n, reps, lambda: check(verifier, multi)),
    )
    row(
        "Twilio: verify, 2 tokens, match on the 2nd", timed(n, reps, lambda: check(rotated, params))
    )
    validator = RequestValidator(token)
    row(
        "Twilio: floor, RequestValidator.validate, dict",
        timed(n, reps, lambda: validator.validate(url, params, signature)),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per rep")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (median reported)")
    args = parser.parse_args()
    print(f"{'case':<58} {'per call':>11}   {'rate':>12}")
    asyncio.run(bench_sns(args.n, args.reps))
    bench_twilio(args.n, args.reps)


if __name__ == "__main__":
    main()
