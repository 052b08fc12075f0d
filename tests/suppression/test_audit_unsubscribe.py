"""Audit: the public one-click unsubscribe endpoints under hostile input and failures.

RFC 8058 / issue 6: no cookies or auth needed, an undecryptable token is a 400 problem
document that changes nothing, a GET never changes anything; DESIGN.md: nothing from outside
gets a 500 (a database outage is a 503, so the mailbox provider tries again).
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gateway.app import create_app
from gateway.services import Services, build_services
from gateway.settings import Settings
from suppression.models import Suppression, SuppressionHistory
from suppression.tokens import issue_token
from tests.conftest import replace_settings

ONE_CLICK = {"List-Unsubscribe": "One-Click"}
_TOKEN_CHARS = st.text(
    # No C0/C1 controls or DEL: httpx refuses them in a URL before any request is made.
    alphabet=st.characters(
        min_codepoint=33, max_codepoint=0x2FF, exclude_characters="/?#%\x7f",
        exclude_categories=("Cc",),
    ),
    min_size=1,
    max_size=200,
)


def token_for(services: Services, **changes: str) -> str:
    fields = {"channel": "email", "address": "Reader@Example.com", "topic": "marketing"}
    fields.update(changes)
    return issue_token(
        services.protector,
        channel=fields["channel"],
        address=fields["address"],
        topic=fields["topic"],
        delivery_id=uuid.uuid4(),
    )


async def counts(services: Services) -> tuple[int, int]:
    async with services.sessions() as s:
        entries = await s.scalar(select(func.count()).select_from(Suppression))
        history = await s.scalar(select(func.count()).select_from(SuppressionHistory))
    return int(entries or 0), int(history or 0)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    token=st.one_of(_TOKEN_CHARS, st.just("gAAAAA" + "A" * 120)),
    method=st.sampled_from(["GET", "POST"]),
    body=st.one_of(st.just(b"List-Unsubscribe=One-Click"), st.binary(max_size=64)),
)
async def test_any_unreadable_token_is_a_4xx_and_changes_nothing(
    client: httpx.AsyncClient, services: Services, token: str, method: str, body: bytes
) -> None:
    response = await client.request(
        method,
        f"/unsubscribe/{token}",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    # 400 for a token that does not decrypt; 404 when the text is no single path segment.
    assert response.status_code in (400, 404), (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert await counts(services) == (0, 0)


@pytest.mark.parametrize(
    "changes",
    [{"topic": "not a topic!"}, {"address": "not-an-address"}, {"channel": "sms"}],
)
async def test_decryptable_token_with_unusable_content_is_400(
    client: httpx.AsyncClient, services: Services, changes: dict[str, str]
) -> None:
    # A token only we can make, but whose content cannot be applied (e.g. made by an older
    # release with other rules): 400 problem document, nothing stored.
    token = token_for(services, **changes)
    response = await client.post(f"/unsubscribe/{token}", data=ONE_CLICK)
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "urn:problem:invalid-unsubscribe-token"
    assert await counts(services) == (0, 0)


async def test_cookies_and_foreign_credentials_do_not_matter(
    client: httpx.AsyncClient, services: Services
) -> None:
    # RFC 8058: the POST carries no cookies or authorization; if a client sends some anyway
    # (or garbage), the public route neither needs nor rejects them.
    token = token_for(services)
    response = await client.post(
        f"/unsubscribe/{token}",
        data=ONE_CLICK,
        headers={"Authorization": "Bearer not-a-key", "Cookie": "session=abc"},
    )
    assert response.status_code == 200, response.text
    assert "location" not in response.headers
    assert await counts(services) == (1, 1)


async def test_database_outage_is_503_not_500(settings: Settings) -> None:
    down = replace_settings(settings, database_url="postgresql://postgres@127.0.0.1:1/nowhere")
    assert down.database_url is not None
    services = build_services(down, down.database_url)
    try:
        transport = httpx.ASGITransport(app=create_app(services))  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
            token = token_for(services)
            response = await c.post(f"/unsubscribe/{token}", data=ONE_CLICK)
            assert response.status_code == 503, response.text
            assert response.headers["content-type"].startswith("application/problem+json")
            assert int(response.headers["retry-after"]) > 0
            # The confirmation page needs no database: a GET still works.
            assert (await c.get(f"/unsubscribe/{token}")).status_code == 200
    finally:
        await services.close()
