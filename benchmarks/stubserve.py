"""The provider stubs of tests/stubs (SESv2, Twilio) in a process of their own, answering at once.

``python -m benchmarks.stubserve`` prints one JSON line ``{"ses": url, "twilio": url,
"twilio_account_sid": ..., "twilio_auth_token": ...}`` and serves until stdin closes. The
stubs' request logs are emptied every few seconds so a long run does not grow them.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time

from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import ACCOUNT_SID, AUTH_TOKEN, TwilioStub


def main() -> None:
    ses = SesStub().start()
    twilio = TwilioStub().start()
    stubs = (ses, twilio)

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


if __name__ == "__main__":
    main()
