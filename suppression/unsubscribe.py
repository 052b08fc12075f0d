"""RFC 8058 one-click unsubscribe: applying a token, and the confirmation page behind GET.

`POST /unsubscribe/{token}` with `List-Unsubscribe=One-Click` suppresses the token's topic for
its address. A GET only renders a page whose button POSTs exactly that body, because link
scanners fetch every URL in a message and must never unsubscribe anyone.
"""

from __future__ import annotations

import datetime as dt
import html
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from suppression.crypto import AddressProtector
from suppression.normalize import InvalidAddress, normalize
from suppression.service import Source, add, validate_entry
from suppression.tokens import InvalidUnsubscribeToken, UnsubscribeToken

ONE_CLICK_FIELD = "List-Unsubscribe"
ONE_CLICK_VALUE = "One-Click"
_MAX_USER_AGENT = 512


@dataclass(frozen=True)
class UnsubscribeResult:
    """What an unsubscribe did: `created` is False when the topic was already suppressed."""

    token: UnsubscribeToken
    created: bool


async def apply_unsubscribe(
    session: AsyncSession,
    protector: AddressProtector,
    token: UnsubscribeToken,
    *,
    user_agent: str | None,
    client_ip: str | None,
    default_region: str = "US",
    now: dt.datetime | None = None,
) -> UnsubscribeResult:
    """Suppress the token's topic for its address, with evidence; a repeat changes nothing.

    Raises `InvalidUnsubscribeToken` when the token's content cannot be used (a token we
    issued always can). The caller commits.
    """
    try:
        address = normalize(token.channel, token.address, default_region)
        validate_entry(token.channel, "unsubscribe", token.topic)
    except (InvalidAddress, ValueError):
        raise InvalidUnsubscribeToken("the unsubscribe token is malformed") from None
    now = now or dt.datetime.now(dt.UTC)
    evidence: dict[str, Any] = {
        "at": now.isoformat(),
        "delivery_id": str(token.delivery_id) if token.delivery_id else None,
        "token_issued_at": token.issued_at.isoformat(),
        "user_agent": (user_agent or "")[:_MAX_USER_AGENT] or None,
        "client_ip": client_ip,
    }
    _, created = await add(
        session,
        protector,
        address,
        reason="unsubscribe",
        scope=token.topic,
        source=Source(
            "unsubscribe",
            str(token.delivery_id) if token.delivery_id else None,
            actor="recipient",
            evidence=evidence,
        ),
        record_existing=False,
    )
    return UnsubscribeResult(token, created)


def mask_address(address: str) -> str:
    """Enough of an address for its owner to recognise it, not enough to harvest it."""
    local, at, domain = address.rpartition("@")
    if at:
        return f"{local[:1]}***@{domain}"
    return f"{'*' * max(len(address) - 4, 3)}{address[-4:]}"


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;"
    "color:#222}button{font-size:1rem;padding:.6rem 1.2rem;cursor:pointer}"
)


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<meta name="robots" content="noindex">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def confirmation_page(token: UnsubscribeToken) -> str:
    """The GET page: who and what, and a button that POSTs the one-click body."""
    who = html.escape(mask_address(token.address))
    topic = html.escape(token.topic)
    return _page(
        "Unsubscribe",
        f"<p>Stop sending <strong>{topic}</strong> messages to <strong>{who}</strong>?</p>"
        # An empty action posts back to this same URL; the body is exactly RFC 8058's.
        '<form method="post">'
        f'<input type="hidden" name="{ONE_CLICK_FIELD}" value="{ONE_CLICK_VALUE}">'
        '<button type="submit">Unsubscribe</button></form>',
    )


def done_page(token: UnsubscribeToken) -> str:
    """The page answered to a POST (mail clients ignore it; people see it)."""
    who = html.escape(mask_address(token.address))
    topic = html.escape(token.topic)
    return _page(
        "You are unsubscribed",
        f"<p>{who} will no longer receive <strong>{topic}</strong> messages.</p>",
    )


def invalid_link_page() -> str:
    """The page a person sees for a garbled or no longer readable unsubscribe link."""
    return _page(
        "This unsubscribe link is not valid",
        "<p>The link may have been cut off or changed when it was copied, or it is too old "
        "to be read any more. Nothing was changed.</p>"
        "<p>To unsubscribe, open the link again from the most recent message you received "
        "(or use your mail program's own unsubscribe button). If that does not work, reply "
        "to the message and ask the sender to remove you.</p>",
    )


# Served with every unsubscribe page: never cached, never indexed, the tokenized URL never
# leaks through a Referer, and nothing but our inline style and our own form may run.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Robots-Tag": "noindex",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
}
