"""The HTTP side of a push: one POST to an endpoint, to an address checked at this very
connection.

The name in the URL is resolved here (`ssrf.resolve_public`), every address is checked, and
the request goes to a checked address: the URL's host is replaced by the address, while the
`Host` header and TLS (SNI and the certificate check, through httpx's `sni_hostname`
extension) keep the name. So there is no second, unchecked resolution between check and
connect for a rebinding DNS answer to slip into. Redirects are not followed (a 3xx is a
failed try), no proxy from the environment is used, and a try is bounded in time as a whole,
not only per read, so a receiver that trickles its answer cannot hold a worker.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass

import httpx

from webhooks.outbound.ssrf import UnsafeUrl, resolve_public

USER_AGENT = "feedback-gateway-webhooks/1"
# How much of an answer's body is read (and thrown away) so the connection can be reused.
MAX_ANSWER_BYTES = 64 * 1024
MAX_ERROR_LENGTH = 500


@dataclass(frozen=True)
class TryResult:
    """What one try got: a status code (None without an answer), how long it took, and an
    error (None for a 2xx)."""

    status_code: int | None
    latency_ms: int
    error: str | None

    @property
    def ok(self) -> bool:
        """The endpoint accepted the event."""
        return self.error is None


class PushClient:
    """Posts signed events to endpoints (one per process; an httpx AsyncClient inside)."""

    def __init__(
        self,
        *,
        allow_private: bool,
        connect_timeout: float,
        read_timeout: float,
        max_connections: int,
        ca_bundle: str | None = None,
    ) -> None:
        self._allow_private = allow_private
        self._connect_timeout = connect_timeout
        # The whole try: resolution and connect, sending, and reading the answer.
        self._budget = 2 * connect_timeout + read_timeout
        verify: ssl.SSLContext | bool = True
        if ca_bundle:
            verify = ssl.create_default_context(cafile=ca_bundle)
        self._client = httpx.AsyncClient(
            verify=verify,
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(
                connect=connect_timeout, read=read_timeout, write=read_timeout, pool=read_timeout
            ),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            headers={"user-agent": USER_AGENT},
        )

    @property
    def budget_seconds(self) -> float:
        """The longest one try may take."""
        return self._budget

    async def close(self) -> None:
        """Close pooled connections."""
        await self._client.aclose()

    async def post(self, url: str, headers: dict[str, str], body: str) -> TryResult:
        """POST `body` with `headers` to `url`; never raises for what the endpoint or the
        network did (that is the result's error)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._budget):
                status = await self._post(url, headers, body.encode())
        except UnsafeUrl as exc:
            return self._result(started, None, f"refused: {exc}")
        except TimeoutError:
            return self._result(started, None, f"timeout after {self._budget:g} s")
        except httpx.TimeoutException as exc:
            return self._result(started, None, f"timeout: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return self._result(started, None, f"{type(exc).__name__}: {exc}")
        except (OSError, ssl.SSLError) as exc:
            return self._result(started, None, f"{type(exc).__name__}: {exc}")
        error = None if 200 <= status < 300 else f"HTTP {status}"
        return self._result(started, status, error)

    async def _post(self, url: str, headers: dict[str, str], body: bytes) -> int:
        target = await resolve_public(
            url, allow_private=self._allow_private, time_limit=self._connect_timeout
        )
        parsed = httpx.URL(url)
        extensions = {"sni_hostname": target.host} if parsed.scheme == "https" else {}
        request_headers = {**headers, "host": parsed.netloc.decode("ascii")}
        last: httpx.ConnectError | None = None
        # Each checked address in resolver order until one accepts the connection.
        for address in target.addresses:
            try:
                async with self._client.stream(
                    "POST",
                    parsed.copy_with(host=address),
                    headers=request_headers,
                    content=body,
                    extensions=extensions,
                ) as response:
                    read = 0
                    async for chunk in response.aiter_raw():
                        read += len(chunk)
                        if read >= MAX_ANSWER_BYTES:
                            break
                    return response.status_code
            except httpx.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    @staticmethod
    def _result(started: float, status: int | None, error: str | None) -> TryResult:
        latency = int((time.monotonic() - started) * 1000)
        if error is not None:
            error = error[:MAX_ERROR_LENGTH]
        return TryResult(status, latency, error)
