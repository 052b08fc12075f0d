"""The provider stubs of tests/stubs (SESv2, Twilio) in a process of their own, answering at once.

``python -m benchmarks.stubserve`` prints one JSON line ``{"ses": url, "twilio": url,
"twilio_account_sid": ..., "twilio_auth_token": ...}`` and serves until stdin closes. The
stubs' request logs are emptied every few seconds so a long run does not grow them.

Options (the campaign scenario):

* ``--rate N``: each stub takes at most N calls a second per key (its credentials: one token
  bucket of N tokens per second, N deep); beyond it answers like the provider does when
  throttling (Twilio 429 / 20429, SES 429 TooManyRequestsException).
* ``--probe-log PATH --probe-prefix P[,P...]``: every call for a recipient starting with one
  of the prefixes is written to PATH as a JSON line ``{"to", "at"}`` (wall-clock time of its
  arrival), for the latency from acceptance to the provider call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from typing import Any, TextIO

from tests.stubs._server import Behavior, StubServer
from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub


class Limits:
    """Token buckets per key (thread-safe), plus the probe log."""

    def __init__(self, rate: float | None, probe: TextIO | None, prefixes: tuple[str, ...]) -> None:
        self.rate = rate
        self.probe = probe
        self.prefixes = prefixes
        self.buckets: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()
        self.throttled = 0

    def allow(self, key: str) -> bool:
        if self.rate is None:
            return True
        now = time.monotonic()
        with self.lock:
            tokens, last = self.buckets.get(key, (self.rate, now))
            tokens = min(self.rate, tokens + (now - last) * self.rate)
            if tokens < 1:
                self.buckets[key] = (tokens, now)
                self.throttled += 1
                return False
            self.buckets[key] = (tokens - 1, now)
            return True

    def note(self, recipient: str | None) -> None:
        if self.probe is None or not recipient or not recipient.startswith(self.prefixes):
            return
        with self.lock:
            self.probe.write(json.dumps({"to": recipient, "at": time.time()}) + "\n")
            self.probe.flush()


def limited(stub: StubServer, limits: Limits, throttle: Behavior) -> None:
    """Wrap a stub's `check` (rate per credentials) and `parse` (probe log) in place."""
    check, parse = stub.check, stub.parse

    def checked(path: str, headers: dict[str, str]) -> Behavior | None:
        refused = check(path, headers)
        if refused is not None:
            return refused
        return None if limits.allow(headers.get("authorization", "")[:60]) else throttle

    def parsed(path: str, headers: dict[str, str], raw: bytes) -> tuple[Any, str | None]:
        body, recipient = parse(path, headers, raw)
        limits.note(recipient)
        return body, recipient

    stub.check = checked  # type: ignore[method-assign]
    stub.parse = parsed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stubserve")
    parser.add_argument("--rate", type=float, help="calls per second per key (default: any)")
    parser.add_argument("--probe-log", help="write calls to probe recipients here")
    parser.add_argument("--probe-prefix", default="", help="comma-separated recipient prefixes")
    args = parser.parse_args(argv)
    probe = open(args.probe_log, "a") if args.probe_log else None
    limits = Limits(args.rate, probe, tuple(p for p in args.probe_prefix.split(",") if p))
    ses = SesStub().start()
    twilio = TwilioStub().start()
    stubs = (ses, twilio)
    limited(
        ses,
        limits,
        Behavior.error(429, "TooManyRequestsException", "Maximum sending rate exceeded."),
    )
    limited(twilio, limits, Behavior.error(429, 20429, "Too Many Requests"))

    def trim() -> None:
        while True:
            time.sleep(2)
            for stub in stubs:
                with stub._lock:
                    stub.calls.clear()
                    stub.accepted.clear()

    threading.Thread(target=trim, daemon=True).start()
    print(
        json.dumps(
            {
                "ses": ses.url,
                "twilio": twilio.url,
                "twilio_account_sid": ACCOUNT_SID,
                "twilio_auth_token": AUTH_TOKEN,
            }
        ),
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.read()
    for stub in stubs:
        stub.stop()
    if args.rate is not None:
        print(json.dumps({"throttled": limits.throttled}), flush=True)
    if probe is not None:
        probe.close()


if __name__ == "__main__":
    main()
