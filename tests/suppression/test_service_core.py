"""Core suppression rules: scopes, expiry, history."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from gateway.services import Services
from suppression import service
from suppression.models import Suppression, SuppressionHistory
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


async def test_protected_reasons_upgrade_weaker_entries(services: Services) -> None:
    addr = normalize_email("upgrade@example.com")
    h = services.protector.hash("email", addr.key)
    async with services.sessions() as s:
        await service.add(
            s, services.protector, addr, reason="hard_bounce",
            source=service.Source("provider_event", "b1"),
        )  # fmt: skip
        entry, created = await service.add(
            s, services.protector, addr, reason="complaint",
            source=service.Source("provider_event", "c1"),
        )  # fmt: skip
        assert not created and (entry.reason, entry.source_id) == ("complaint", "c1")
        # a weaker reason never downgrades it
        entry, _ = await service.add(
            s, services.protector, addr, reason="manual", source=service.Source("operator")
        )
        assert entry.reason == "complaint"
        await s.commit()
        history = await service.history_for(s, "email", h)
        assert [(x.action, x.reason) for x in history] == [
            ("add", "hard_bounce"),
            ("upgrade", "complaint"),
            ("add_existing", "manual"),
        ]
        assert history[1].details["previous_reason"] == "hard_bounce"
        # so it is protected now
        try:
            await service.remove_by_operator(s, "email", h, reason="x", actor="op")
        except service.ProtectedSuppression as exc:
            assert exc.reasons == ["complaint"]
        else:
            raise AssertionError("a complaint was removed without force")


async def test_add_many_upgrades_and_renews_like_add(services: Services) -> None:
    p = services.protector
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    async with services.sessions() as s:
        await service.add(s, p, normalize_email("m@example.com"), reason="manual",
                          source=service.Source("operator"))  # fmt: skip
        await service.add(s, p, normalize_email("e@example.com"), reason="soft_bounce",
                          expires_at=past, source=service.Source("provider_event"))  # fmt: skip
        await s.commit()
        flags = await service.add_many(
            s,
            p,
            [
                service.NewEntry(normalize_email("m@example.com"), "complaint"),
                service.NewEntry(normalize_email("e@example.com"), "hard_bounce"),
                service.NewEntry(normalize_email("n@example.com"), "hard_bounce"),
                service.NewEntry(normalize_email("n@example.com"), "complaint"),
            ],
            source_type="import",
            source_id="imp-1",
            actor="test",
        )
        await s.commit()
        assert flags == [False, True, False, True]
        reasons = {
            p.decrypt(r.address_encrypted or ""): r.reason
            for r in (await s.execute(select(Suppression))).scalars()
        }
        assert reasons == {
            "m@example.com": "complaint",
            "e@example.com": "hard_bounce",
            "n@example.com": "complaint",
        }
        rows = await s.execute(
            select(SuppressionHistory.action, SuppressionHistory.reason)
            .where(SuppressionHistory.source_type == "import")
            .order_by(SuppressionHistory.id)
        )
        assert sorted(rows.all()) == [
            ("add", "complaint"),
            ("add", "hard_bounce"),
            ("upgrade", "complaint"),
        ]
