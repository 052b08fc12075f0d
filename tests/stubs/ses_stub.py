"""A small local SES v2 stand-in for what moto's sesv2 does not model.

moto (server mode) covers the plain path, but drops `Headers` and `EmailTags` and cannot
answer with throttling, paused-account or 5xx errors. This stub implements
`POST /v2/email/outbound-emails`, keeps every request body (tags, headers, configuration
set), answers `{"MessageId": ...}`, and errors the way the restJson1 protocol does
(`x-amzn-ErrorType` header plus a JSON `message`). Behaviours are scripted per request or per
destination address (see `_server`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.stubs._server import Behavior, StubServer


class SesStub(StubServer):
    """SESv2 SendEmail stub; `accepted` holds every accepted request body."""

    def parse(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[Any, str | None]:
        body = json.loads(raw or b"{}")
        to = (body.get("Destination") or {}).get("ToAddresses") or [None]
        return body, to[0]

    def check(self, path: str, headers: dict[str, str]) -> Behavior | None:
        if path != "/v2/email/outbound-emails":
            return Behavior.error(404, "NotFoundException", "unknown operation")
        if "authorization" not in headers:
            return Behavior.error(403, "MissingAuthenticationTokenException", "missing auth")
        return None

    def success(self, body: Any) -> tuple[int, dict[str, Any], dict[str, Any]]:
        message_id = f"0100018c{uuid.uuid4().hex[:8]}-{uuid.uuid4()}-000000"
        return 200, {"MessageId": message_id}, {**body, "MessageId": message_id}

    def failure(self, behavior: Behavior) -> tuple[int, dict[str, Any], dict[str, str]]:
        return (
            behavior.status,
            {"message": behavior.message},
            {"x-amzn-ErrorType": str(behavior.code), "x-amzn-RequestId": str(uuid.uuid4())},
        )
