"""A local stand-in for Twilio's Messages create endpoint (driven through the real client).

`POST /2010-04-01/Accounts/{AccountSid}/Messages.json` with HTTP Basic auth (account SID and
auth token), form parameters To/From/MessagingServiceSid/Body/StatusCallback. Success is 201
with a Message resource; errors use Twilio's JSON error shape (`code`, `message`,
`more_info`, `status`). Behaviours are scripted per request or per `To` (see `_server`).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any
from urllib.parse import parse_qs

from tests.stubs._server import Behavior, StubServer

ACCOUNT_SID = "AC" + "1" * 32
AUTH_TOKEN = "stub-auth-token-0123456789abcdef"


class TwilioStub(StubServer):
    """Twilio Messages API stub; `accepted` holds every created message's parameters."""

    def __init__(self, account_sid: str = ACCOUNT_SID, auth_token: str = AUTH_TOKEN) -> None:
        super().__init__()
        self.account_sid = account_sid
        self.auth_token = auth_token

    def parse(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[Any, str | None]:
        params = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
        return params, params.get("To")

    def check(self, path: str, headers: dict[str, str]) -> Behavior | None:
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode()
        if headers.get("authorization") != f"Basic {expected}":
            return Behavior.error(401, 20003, "Authenticate")
        if path != f"/2010-04-01/Accounts/{self.account_sid}/Messages.json":
            return Behavior.error(404, 20404, "The requested resource was not found")
        return None

    def success(self, body: Any) -> tuple[int, dict[str, Any], dict[str, Any]]:
        sid = "SM" + secrets.token_hex(16)
        record = {**body, "sid": sid}
        answer = {
            "sid": sid,
            "account_sid": self.account_sid,
            "to": body.get("To"),
            "from": body.get("From"),
            "messaging_service_sid": body.get("MessagingServiceSid"),
            "body": body.get("Body"),
            "status": "accepted" if body.get("MessagingServiceSid") else "queued",
            "num_segments": "1",
            "direction": "outbound-api",
            "api_version": "2010-04-01",
            "error_code": None,
            "error_message": None,
            "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json",
        }
        return 201, answer, record

    def failure(self, behavior: Behavior) -> tuple[int, dict[str, Any], dict[str, str]]:
        answer = {
            "code": behavior.code,
            "message": behavior.message,
            "more_info": f"https://www.twilio.com/docs/errors/{behavior.code}",
            "status": behavior.status,
        }
        return behavior.status, answer, {}
