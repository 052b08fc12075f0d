"""What a feedback-side provider declares: one `FeedbackSpec` per provider, registered by
`gateway` (see `gateway/providers.py`).

A spec names the provider and its channel, its HTTP routes (built on demand, so that
declaring a spec imports no web framework), how its events are classified (the table-key
function and its default rows, see `webhooks.classify.register`) and how its verifier is
built from the provider settings. A new provider's routes are usually one
`webhooks.api.webhook_route(...)`: verify (`Verifier`), parse (`Parser`), ingest, with the
same problem documents and dispositions as the built-in endpoints.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sender.providers.spec import ProviderContext
from webhooks.events import FeedbackEvent

TableKeys = Callable[[FeedbackEvent], list[str]]


@dataclass(frozen=True)
class WebhookRequest:
    """One provider request as a verifier and a parser see it.

    `url` is what the provider called: the public URL (GATEWAY_PUBLIC_URL, behind proxies)
    + path + the query string as sent. `headers` have lower-case names.
    """

    url: str
    body: bytes
    headers: Mapping[str, str]
    query: Mapping[str, str]
    default_region: str = "US"


class Verifier(Protocol):
    """Proves a request came from the provider (raises `webhooks.errors.VerificationFailed`,
    or `TemporaryFailure`); `configured` is False when it refuses everything."""

    @property
    def configured(self) -> bool:
        """True when the verifier can accept anything at all."""
        ...

    def verify(self, request: WebhookRequest) -> Awaitable[None] | None:
        """Raise unless `request` is provably from the provider."""
        ...


# A verified request -> its normalized events (raises `MalformedPayload` for bad input).
Parser = Callable[[WebhookRequest], Sequence[FeedbackEvent]]


@dataclass(frozen=True)
class FeedbackSpec:
    """One provider's feedback side (see the module docstring)."""

    name: str
    channel: str
    # Route handlers, built when an app is built (each app gets its own).
    routes: Callable[[], Sequence[Any]]
    # Classification (None: the provider is classified by `webhooks.classify` itself).
    table_keys: TableKeys | None = None
    table: Mapping[str, str] = field(default_factory=dict)
    # Builds the verifier its routes use (None: the route verifies by other means).
    build_verifier: Callable[[ProviderContext], Verifier] | None = None
