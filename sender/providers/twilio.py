"""Twilio Programmable Messaging send adapter: one `messages.create` call per delivery.

* Correlation: `status_callback = <public URL>/webhooks/twilio/status?d=<delivery id>`; the
  callback URL is covered by Twilio's request signature, so the delivery id in it is
  trustworthy even when the process died before it stored the Message SID.
* `from_` is the configured sender number, or else the Messaging Service SID.
* `api_base` (setting `GATEWAY_TWILIO_API_BASE`) points the client at another base URL
  (a local stub, a Twilio edge) through the SDK's documented seam (`Client(http_client=...)`
  with a `TwilioHttpClient` subclass whose `request` rewrites `https://<anything>.twilio.com`
  to the base and then calls the SDK's own `request`).
* Timeouts are explicit and the HTTP client does no retries; the twilio client is synchronous,
  so calls run on a small dedicated thread pool (one client per thread: `requests` sessions
  are not meant to be shared between threads).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.rest import Client

from sender.classify import SendOutcome, Transport
from sender.providers.base import OutgoingMessage, parse_retry_after

log = logging.getLogger("gateway.sender.twilio")

STATUS_CALLBACK_PATH = "/webhooks/twilio/status"


def status_callback_url(public_url: str, delivery_id: object) -> str:
    """The status-callback URL that carries the delivery id (signed by Twilio on callback)."""
    return f"{public_url.rstrip('/')}{STATUS_CALLBACK_PATH}?{urlencode({'d': str(delivery_id)})}"


class _SplitTimeoutAdapter(HTTPAdapter):
    """A requests transport adapter (requests' documented extension point, mounted on the
    SDK client's session) that turns the SDK's single timeout into (connect, read): a slow
    connect means nothing was sent; a slow read is ambiguous. It never retries."""

    def __init__(self, connect_timeout: float) -> None:
        super().__init__(max_retries=0)
        self._connect_timeout = connect_timeout

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float | None, float | None] | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        if isinstance(timeout, int | float):
            timeout = (min(self._connect_timeout, float(timeout)), float(timeout))
        return super().send(
            request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )


class _GatewayHttpClient(TwilioHttpClient):  # type: ignore[misc]
    """The SDK's own HTTP client, extended only through its documented seams.

    * Constructor arguments: `timeout` (the read timeout), a pooled session, no retries.
    * `http_client=` of `Client` (twilio-python's "custom HTTP client" guide).
    * `request` is overridden only to rewrite the URL (`api_base`) and to read the answer's
      headers (Retry-After); the SDK's own `request` does the call, its logging and its
      response building, so an SDK upgrade changes them for us too.
    * The connect timeout comes from a requests transport adapter on the client's session.
      Should the SDK stop providing a requests session, the constructor fails at start
      (and tests/sender/test_twilio_path.py), rather than sends silently losing a timeout.
    """

    def __init__(self, *, api_base: str | None, connect_timeout: float, read_timeout: float):
        super().__init__(pool_connections=True, timeout=read_timeout)
        self._api_base = urlsplit(api_base.rstrip("/")) if api_base else None
        self.last_headers: dict[str, str] = {}
        session = getattr(self, "session", None)
        if not isinstance(session, requests.Session):
            raise RuntimeError("twilio.http.http_client.TwilioHttpClient has no requests session")
        adapter = _SplitTimeoutAdapter(connect_timeout)
        session.mount("https://", adapter)
        session.mount("http://", adapter)

    def _rewrite(self, url: str) -> str:
        if self._api_base is None:
            return url
        parts = urlsplit(url)
        if not (parts.hostname or "").endswith("twilio.com"):
            return url
        base = self._api_base
        return urlunsplit((base.scheme, base.netloc, base.path + parts.path, parts.query, ""))

    def request(
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,
        allow_redirects: bool = False,
    ) -> Any:
        """The SDK's `request` against the rewritten URL; remembers the answer's headers."""
        self.last_headers = {}
        response = super().request(
            method,
            self._rewrite(url),
            params=params,
            data=data,
            headers=headers,
            auth=auth,
            timeout=timeout,
            allow_redirects=allow_redirects,
        )
        self.last_headers = {k.lower(): v for k, v in (response.headers or {}).items()}
        return response


class TwilioProvider:
    """Sends SMS through `client.messages.create`."""

    name = "twilio"
    channel = "sms"

    def __init__(
        self,
        *,
        account_sid: str,
        auth_token: str,
        public_url: str,
        sms_from: str | None = None,
        messaging_service_sid: str | None = None,
        api_base: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        max_workers: int = 16,
    ) -> None:
        if not (sms_from or messaging_service_sid):
            raise ValueError("a sender number or a Messaging Service SID is required")
        self._account_sid = account_sid
        self._auth_token = auth_token
        self._public_url = public_url
        self._from = sms_from
        self._service = messaging_service_sid
        self._api_base = api_base
        self._timeouts = (connect_timeout, read_timeout)
        self._local = threading.local()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="twilio-send"
        )

    def _client(self) -> tuple[Any, _GatewayHttpClient]:
        pair: tuple[Any, _GatewayHttpClient] | None = getattr(self._local, "pair", None)
        if pair is None:
            http = _GatewayHttpClient(
                api_base=self._api_base,
                connect_timeout=self._timeouts[0],
                read_timeout=self._timeouts[1],
            )
            pair = (Client(self._account_sid, self._auth_token, http_client=http), http)
            self._local.pair = pair
        return pair

    def limiter_key(self, message: OutgoingMessage) -> str:
        """Twilio throughput is per sender (number or Messaging Service)."""
        return f"twilio:{message.sender or self._from or self._service}"

    def create_kwargs(self, message: OutgoingMessage) -> dict[str, Any]:
        """The `messages.create` keyword arguments for one delivery."""
        kwargs: dict[str, Any] = {
            "to": message.to,
            "body": message.body or "",
            "status_callback": status_callback_url(self._public_url, message.delivery_id),
        }
        sender = message.sender or self._from
        if sender:
            kwargs["from_"] = sender
        else:
            kwargs["messaging_service_sid"] = self._service
        return kwargs

    def _send_sync(self, message: OutgoingMessage) -> SendOutcome:
        client, http = self._client()
        try:
            created = client.messages.create(**self.create_kwargs(message))
        except TwilioRestException as exc:
            return SendOutcome(
                self.name,
                error_code=str(exc.code) if exc.code is not None else None,
                http_status=exc.status,
                retry_after=parse_retry_after(http.last_headers.get("retry-after")),
                message=exc.msg,
            )
        except requests.exceptions.ConnectTimeout as exc:
            return SendOutcome(self.name, transport="not_sent", message=str(exc))
        except requests.exceptions.ReadTimeout as exc:
            return SendOutcome(self.name, transport="after_send", message=str(exc))
        except requests.exceptions.ConnectionError as exc:
            return SendOutcome(self.name, transport=_connection_phase(exc), message=str(exc))
        except (requests.exceptions.RequestException, TwilioException) as exc:
            return SendOutcome(self.name, transport="after_send", message=str(exc))
        return SendOutcome(self.name, provider_message_id=str(created.sid))

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """One `messages.create` call; every failure is reported, none raised."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._send_sync, message)
        except Exception as exc:
            log.exception("unexpected error from Twilio messages.create")
            return SendOutcome(self.name, transport="after_send", message=repr(exc))

    async def close(self) -> None:
        """Stop the thread pool (per-thread HTTP sessions go with their threads)."""
        self._executor.shutdown(wait=False, cancel_futures=True)


def _connection_phase(exc: BaseException) -> Transport:
    """`not_sent` when the connection could not be opened, else `after_send`.

    requests wraps urllib3's errors: a `NewConnectionError` (refused, DNS) means no byte of
    the request left; a `ProtocolError` ("Connection aborted", remote disconnected) means the
    connection broke after the request was written, so Twilio may have created the message.
    """
    import urllib3.exceptions

    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(
            current,
            urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError,
        ):
            return "not_sent"
        if isinstance(current, urllib3.exceptions.MaxRetryError):
            stack.append(current.reason)
        stack.extend(a for a in current.args if isinstance(a, BaseException))
        stack.append(current.__cause__)
        stack.append(current.__context__)
    return "after_send"
