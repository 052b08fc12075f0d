"""Core suppression rules: scopes, expiry, history."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from gateway.services import Services
from suppression import service
from suppression.models import SuppressionHistory
from suppression.normalize import normalize_email


async def test_scope_rules_and_history(services: Services) -> None:
    addr = normalize_email("Someone@Example.com")
    h = services.protector.hash("email", addr.key)
    async with services.sessions() as s:
        await service.add(
            s,
            services.protector,
            addr,
            reason="unsubscribe",
            scope="marketing",
            source=service.Source("unsubscribe", "tok"),
        )
        await s.commit()
        # a topic unsubscribe blocks marketing on that topic, never transactional mail
        assert (
            await service.check(s, "email", h, category="marketing", topic="marketing")
        ).reason == "unsubscribe"
        assert await service.check(s, "email", h, category="transactional") is None
        assert await service.check(s, "email", h, category="marketing", topic="news") is None
        await service.add(
            s,
            services.protector,
            addr,
            reason="hard_bounce",
            source=service.Source("provider_event", "e1"),
        )
        await s.commit()
        hit = await service.check(s, "email", h, category="transactional")
        assert hit is not None and hit.reason == "hard_bounce" and hit.scope == "all"
        removed = await service.remove(
            s, "email", h, reason="test", source=service.Source("operator", actor="op")
        )
        await s.commit()
        assert {e.reason for e in removed} == {"unsubscribe", "hard_bounce"}
        assert await service.check(s, "email", h, category="marketing", topic="marketing") is None
        actions = (
            (await s.execute(select(SuppressionHistory.action).order_by(SuppressionHistory.id)))
            .scalars()
            .all()
        )
        assert actions == ["add", "add", "remove", "remove"]


async def test_expired_entries_do_not_suppress(services: Services) -> None:
    addr = normalize_email("soft@example.com")
    h = services.protector.hash("email", addr.key)
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    async with services.sessions() as s:
        await service.add(
            s,
            services.protector,
            addr,
            reason="soft_bounce",
            expires_at=past,
            source=service.Source("provider_event", "x"),
        )
        await s.commit()
        assert await service.check(s, "email", h) is None
        # renewing an expired entry makes it active again
        future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
        _, created = await service.add(
            s,
            services.protector,
            addr,
            reason="soft_bounce",
            expires_at=future,
            source=service.Source("provider_event", "y"),
        )
        await s.commit()
        assert created
        assert (await service.check(s, "email", h)) is not None
