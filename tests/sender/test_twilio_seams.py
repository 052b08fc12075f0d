"""The Twilio adapter extends the SDK only through its documented seams.

twilio-python documents `Client(http_client=...)` with a `TwilioHttpClient` (or
`HttpClient`) of one's own whose `request(method, url, params, data, headers, auth, timeout,
allow_redirects)` returns a `twilio.http.response.Response`. The gateway's client overrides
that one method and delegates to the SDK's own; these tests fail (instead of sends breaking
silently) when an SDK upgrade moves what the adapter relies on.
"""

from __future__ import annotations

import inspect

import requests
from requests.adapters import HTTPAdapter
from twilio.http.http_client import TwilioHttpClient
from twilio.http.response import Response

from sender.providers.twilio import _GatewayHttpClient, _SplitTimeoutAdapter


def test_only_the_documented_hook_is_overridden() -> None:
    own = {
        name
        for name, value in vars(_GatewayHttpClient).items()
        if callable(value) and not name.startswith("__")
    }
    # `_rewrite` is the gateway's own helper; of the SDK's methods only `request` is replaced.
    assert own == {"request", "_rewrite"}
    assert "_rewrite" not in vars(TwilioHttpClient)
    sdk = inspect.signature(TwilioHttpClient.request).parameters
    ours = inspect.signature(_GatewayHttpClient.request).parameters
    assert list(ours) == list(sdk)


def test_the_sdk_still_gives_a_requests_session_and_response_headers() -> None:
    client = _GatewayHttpClient(api_base=None, connect_timeout=1.5, read_timeout=9.0)
    assert client.timeout == 9.0  # the SDK's own timeout is the read timeout
    assert isinstance(client.session, requests.Session)
    for prefix in ("https://", "http://"):
        adapter = client.session.get_adapter(prefix + "api.twilio.com/")
        assert isinstance(adapter, _SplitTimeoutAdapter)
        assert adapter.max_retries.total == 0  # the adapter never retries a create
    assert "headers" in inspect.signature(Response).parameters


def test_the_url_is_rewritten_only_for_twilio_hosts() -> None:
    client = _GatewayHttpClient(
        api_base="http://127.0.0.1:9/base", connect_timeout=1.0, read_timeout=2.0
    )
    assert client._rewrite("https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json") == (
        "http://127.0.0.1:9/base/2010-04-01/Accounts/AC1/Messages.json"
    )
    assert client._rewrite("https://example.com/x") == "https://example.com/x"


def test_a_connection_refused_through_the_sdk_keeps_the_timeout_split() -> None:
    seen: list[object] = []

    class Recorder(HTTPAdapter):
        # Sits under the split adapter (MRO): sees the timeout the connection gets.
        def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # type: ignore[no-untyped-def]
            seen.append(timeout)
            return super().send(request, stream, timeout, verify, cert, proxies)

    class Recording(_SplitTimeoutAdapter, Recorder):
        pass

    # Port 9 (discard) on localhost is closed here: the call fails before anything is sent.
    client = _GatewayHttpClient(
        api_base="http://127.0.0.1:9", connect_timeout=1.0, read_timeout=2.0
    )
    client.session.mount("http://", Recording(1.0))
    try:
        client.request("POST", "https://api.twilio.com/x", data={"a": "b"})
    except requests.exceptions.ConnectionError:
        pass
    assert seen == [(1.0, 2.0)]
