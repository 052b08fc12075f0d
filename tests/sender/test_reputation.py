"""The reputation guard against real PostgreSQL: a synthetic window of deliveries (built
set-based in SQL), the worker's evaluation, sends through the real SES and Twilio adapters
to the local stubs, the operator API and its scopes."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from gateway.settings import Settings
from gateway.worker import build_worker
from sender.models import ReputationHistory
from sender.reputation import REASON_PREFIX
from suppression.db import pg_connection, utcnow
from tests.sender.helpers import (
    SMS_FROM,
    Gateway,
    attempts_of,
    delivery,
    email,
    provider_settings,
    sms,
)
from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import TwilioStub
from tests.webhooks.feedback import ses_event

DOMAIN = "example.com"  # the identity of provider_settings' email_from (sender@example.com)
SUCCESS = "success@simulator.amazonses.com"


async def window(
    gw: Gateway,
    *,
    identity: str = DOMAIN,
    channel: str = "email",
    sends: int,
    status: dict[str, int],
    error_codes: dict[str, tuple[str, int]] | None = None,
    refused_opt_outs: int = 0,
    hours_ago: float = 1.0,
) -> str:
    """`sends` accepted deliveries of one identity created `hours_ago`, the first ones in
    the given final statuses (the rest `delivered`), in three set-based statements; the
    first n of status s get an attempt with error code c for `error_codes[s] = (c, n)`.
    `refused_opt_outs` more deliveries failed at send time with Twilio 21610 (no provider
    id). Returns the tag of the rows (their idempotency-key prefix)."""
    tag = uuid.uuid4().hex[:8]
    bounds: list[tuple[str, int]] = []
    upto = 0
    for name, n in status.items():
        upto += n
        bounds.append((name, upto))
    case = " ".join(f"WHEN g <= {b} THEN '{name}'" for name, b in bounds)
    total = sends + refused_opt_outs
    async with pg_connection(gw.services.engine) as conn, conn.transaction():
        await conn.execute(
            """
            INSERT INTO messages (id, client_id, idempotency_key, fingerprint, state, channel,
                category, priority, metadata, created_at)
            SELECT gen_random_uuid(), gen_random_uuid(), $1 || '-' || g, md5(g::text),
                'completed', $2, 'marketing', 'normal', '{}'::jsonb,
                now() - make_interval(secs => $4 * 3600)
            FROM generate_series(1, $3) AS g
            """,
            tag,
            channel,
            total,
            hours_ago,
        )
        await conn.execute(
            f"""
            INSERT INTO deliveries (id, message_id, position, channel, recipient_hash,
                recipient_encrypted, derived_key, status, provider, provider_message_id,
                category, priority_rank, attempts, sender_identity, created_at, updated_at)
            SELECT gen_random_uuid(), m.id, 0, $2, md5(m.id::text), 'synthetic',
                encode(sha256(m.id::text::bytea), 'hex'),
                CASE WHEN g > $4 THEN 'failed' {case} ELSE 'delivered' END,
                $5, CASE WHEN g <= $4 THEN $1 || '-pm-' || g END,
                'marketing', 1, 1, $3, m.created_at, m.created_at
            FROM messages m
            CROSS JOIN LATERAL (SELECT split_part(m.idempotency_key, '-', 2)::int AS g) n
            WHERE m.idempotency_key LIKE $1 || '-%'
            """,
            tag,
            channel,
            identity,
            sends,
            "ses" if channel == "email" else "twilio",
        )
        for name, (code, n) in (error_codes or {}).items():
            await conn.execute(
                """
                INSERT INTO attempts (id, delivery_id, number, status, provider, error_code,
                    started_at)
                SELECT gen_random_uuid(), d.id, 1, 'accepted', d.provider, $3, d.created_at
                FROM deliveries d JOIN messages m ON m.id = d.message_id
                WHERE m.idempotency_key LIKE $1 || '-%' AND d.status = $2
                  AND d.provider_message_id IS NOT NULL
                ORDER BY d.id LIMIT $4
                """,
                tag,
                name,
                code,
                n,
            )
        if refused_opt_outs:
            await conn.execute(
                """
                INSERT INTO attempts (id, delivery_id, number, status, provider, error_code,
                    started_at)
                SELECT gen_random_uuid(), d.id, 1, 'failed', d.provider, '21610', d.created_at
                FROM deliveries d JOIN messages m ON m.id = d.message_id
                WHERE m.idempotency_key LIKE $1 || '-%' AND d.provider_message_id IS NULL
                """,
                tag,
            )
    return tag


async def age(gw: Gateway, tag: str, hours: float) -> None:
    """Move a synthetic window's deliveries `hours` into the past."""
    async with pg_connection(gw.services.engine) as conn:
        await conn.execute(
            "UPDATE deliveries d SET created_at = now() - make_interval(secs => $2 * 3600) "
            "FROM messages m WHERE m.id = d.message_id AND m.idempotency_key LIKE $1 || '-%'",
            tag,
            hours,
        )


async def states(gw: Gateway) -> dict[str, dict[str, Any]]:
    """GET /v1/reputation as identity -> view."""
    r = await gw.client.get("/v1/reputation", headers=gw.headers)
    assert r.status_code == 200, r.text
    return {i["identity"]: i for i in r.json()["identities"]}


async def due_now(gw: Gateway) -> None:
    """Time passes: every waiting delivery is due."""
    async with pg_connection(gw.services.engine) as conn:
        await conn.execute(
            "UPDATE deliveries SET next_attempt_at = now() WHERE next_attempt_at IS NOT NULL"
        )


def _marketing(to: str) -> dict[str, Any]:
    return email(to, category="marketing")


async def test_guard_pauses_marketing_then_everything_and_resumes_when_rates_fall(
    providers_gateway: Gateway, ses_stub: SesStub, caplog: pytest.LogCaptureFixture
) -> None:
    gw = providers_gateway
    guard = gw.services.reputation
    # 1,000 sends in the window, 5 % hard bounces: over the 4 % marketing threshold.
    tag = await window(gw, sends=1000, status={"bounced": 50})
    with caplog.at_level(logging.ERROR, logger="gateway.reputation"):
        changes = await guard.evaluate()
    assert [(c.identity, c.from_state, c.to_state) for c in changes] == [
        (DOMAIN, None, "marketing_paused")
    ]
    (line,) = [r for r in caplog.records if r.name == "gateway.reputation"]
    assert line.levelno == logging.ERROR and DOMAIN in line.getMessage()
    view = (await states(gw))[DOMAIN]
    assert view["state"] == "marketing_paused" and view["sends"] == 1000
    assert view["rates"][0] == {
        "name": "bounce",
        "percent": 5.0,
        "marketing_paused_at": 4.0,
        "all_paused_at": 8.0,
    }
    assert view["rates"][1]["name"] == "complaint"

    # Marketing is deferred: queued with the reason, no attempt, no provider call.
    r = await gw.send(_marketing(SUCCESS))
    assert r.status_code == 202, r.text
    (paused,) = r.json()["deliveries"]
    assert paused["status"] == "queued" and paused["reason"].startswith(REASON_PREFIX)
    assert "marketing sends of example.com" in paused["reason"]
    assert await attempts_of(gw.services, paused["id"]) == []
    assert ses_stub.count == 0
    # Transactional mail of the same identity still goes.
    r = await gw.send(email(SUCCESS))
    assert r.status_code == 201 and r.json()["deliveries"][0]["status"] == "sent"
    assert ses_stub.count == 1
    # The worker leaves the paused delivery waiting.
    await due_now(gw)
    await build_worker(gw.services).drain()
    assert (await delivery(gw.services, paused["id"])).status == "queued"
    assert ses_stub.count == 1

    # 1,000 more sends with 140 bounces (190 of 2,000: 9.5 %): the second level pauses
    # transactional mail too.
    second = await window(gw, sends=1000, status={"bounced": 140})
    changes = await guard.evaluate()
    assert [(c.from_state, c.to_state) for c in changes] == [("marketing_paused", "all_paused")]
    r = await gw.send(email(SUCCESS))
    assert r.status_code == 202
    (held,) = r.json()["deliveries"]
    assert held["status"] == "queued" and "all sends of example.com" in held["reason"]
    assert ses_stub.count == 1

    # The bad sends leave the window: the next evaluation resumes, the worker sends both.
    await age(gw, tag, 25)
    await age(gw, second, 25)
    changes = await guard.evaluate()
    assert [(c.from_state, c.to_state, c.actor) for c in changes] == [("all_paused", "ok", "guard")]
    await due_now(gw)
    await build_worker(gw.services).drain()
    assert (await delivery(gw.services, paused["id"])).status == "sent"
    assert (await delivery(gw.services, held["id"])).status == "sent"
    assert ses_stub.count == 3
    async with gw.services.sessions() as s:
        recorded = (await s.scalars(select(ReputationHistory).order_by(ReputationHistory.at))).all()
    assert [(h.from_state, h.to_state) for h in recorded] == [
        (None, "marketing_paused"),
        ("marketing_paused", "all_paused"),
        ("all_paused", "ok"),
    ]
    assert recorded[0].details["bounces"] == 50 and recorded[0].details["sends"] == 1000


async def test_counting_follows_ses_and_the_minimum_volume(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    # 1,000 sends, 50 bounces of which 20 SES made for its own suppression list (SES does
    # not count those), 10 complaints of which 5 likewise: 3 % bounces (under 4 %), but
    # 0.5 % complaints, over the 0.4 % that pauses everything.
    await window(
        gw,
        sends=1000,
        status={"bounced": 50, "complained": 10},
        error_codes={
            "bounced": ("OnAccountSuppressionList", 20),
            "complained": ("OnAccountSuppressionList", 5),
        },
    )
    # Transient (soft) bounces retried and still `retrying` are not bounces.
    await window(gw, identity="soft.example", sends=600, status={"retrying": 100})
    # Below the minimum volume a 50 % bounce rate pauses nothing.
    await window(gw, identity="small.example", sends=100, status={"bounced": 50})
    # SMS: 1,000 accepted, 120 failed (12 % > 10 %), plus 30 refused at send time with
    # 21610 (opt-outs: 30 / 1,030 = 2.9 % > 1 %); a 21610 in a callback counts as opt-out.
    await window(
        gw,
        identity=SMS_FROM,
        channel="sms",
        sends=1000,
        status={"failed": 120},
        error_codes={"failed": ("21610", 10)},
        refused_opt_outs=30,
    )
    await gw.services.reputation.evaluate()
    seen = await states(gw)
    email_view = seen[DOMAIN]
    assert email_view["sends"] == 1000
    assert [r["percent"] for r in email_view["rates"]] == [3.0, 0.5]
    assert email_view["state"] == "all_paused"
    assert seen["soft.example"]["state"] == "ok"
    assert seen["soft.example"]["rates"][0]["percent"] == 0.0
    assert seen["small.example"]["state"] == "ok"
    assert seen["small.example"]["rates"][0]["percent"] == 50.0
    sms_view = seen[SMS_FROM]
    assert sms_view["channel"] == "sms" and sms_view["sends"] == 1030
    assert [r["name"] for r in sms_view["rates"]] == ["failure", "opt_out"]
    failures, opt_outs = (r["percent"] for r in sms_view["rates"])
    assert failures == round(100 * 110 / 1030, 4) and opt_outs == round(100 * 40 / 1030, 4)
    assert sms_view["state"] == "all_paused"


async def test_sms_guard_pauses_marketing_sms_of_that_sender_only(
    providers_gateway: Gateway, twilio_stub: TwilioStub
) -> None:
    gw = providers_gateway
    await window(gw, identity=SMS_FROM, channel="sms", sends=1000, status={"failed": 110})
    await gw.services.reputation.evaluate()
    r = await gw.send(sms("+15005550006", category="marketing"))
    assert r.status_code == 202 and r.json()["deliveries"][0]["status"] == "queued"
    assert twilio_stub.count == 0
    other = await gw.send(sms("+15005550006", category="marketing", **{"from": "+15005550010"}))
    assert other.status_code == 201, other.text
    assert twilio_stub.count == 1


async def test_operator_resume_scopes_problems_and_hold(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    gw = providers_gateway
    guard = gw.services.reputation
    await window(gw, sends=1000, status={"bounced": 50})
    await guard.evaluate()
    read = {"Authorization": f"Bearer {await gw.make_key('read')}"}
    send_only = {"Authorization": f"Bearer {await gw.make_key('send')}"}
    admin = {"Authorization": f"Bearer {await gw.make_key('admin')}"}
    url = f"/v1/reputation/{DOMAIN}/resume"
    # Scopes: reading needs read, resuming admin.
    assert (await gw.client.get("/v1/reputation")).status_code == 401
    assert (await gw.client.get("/v1/reputation", headers=send_only)).status_code == 403
    assert (await gw.client.get("/v1/reputation", headers=read)).status_code == 200
    r = await gw.client.post(url, json={"reason": "fixed the list"}, headers=read)
    assert r.status_code == 403
    # Bad input: no reason 422, blank reason 422, unknown identity 404; nothing changes.
    for body in ({}, {"reason": "   "}, None):
        r = await gw.client.post(url, json=body, headers=admin)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"] == "urn:problem:resume-reason-required"
    r = await gw.client.post(
        "/v1/reputation/nobody.example/resume", json={"reason": "x"}, headers=admin
    )
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem")
    r = await gw.client.post(url, json={"reason": "x", "extra": 1}, headers=admin)
    assert r.status_code == 400
    assert (await states(gw))[DOMAIN]["state"] == "marketing_paused"

    # The resume: recorded (who, when, why), sends go at once in this process.
    r = await gw.client.post(url, json={"reason": "bad list removed"}, headers=admin)
    assert r.status_code == 200, r.text
    resumed = r.json()
    assert resumed["state"] == "ok" and resumed["resume_reason"] == "bad list removed"
    assert resumed["resumed_by"].startswith("api_key:") and resumed["hold_until"] is not None
    async with gw.services.sessions() as s:
        last = (
            await s.scalars(select(ReputationHistory).order_by(ReputationHistory.at.desc()))
        ).first()
    assert last is not None
    assert (last.actor, last.from_state, last.to_state, last.reason) == (
        resumed["resumed_by"],
        "marketing_paused",
        "ok",
        "bad list removed",
    )
    r = await gw.send(_marketing(SUCCESS))
    assert r.status_code == 201 and ses_stub.count == 1
    # Resuming what is not paused is a conflict.
    r = await gw.client.post(url, json={"reason": "again"}, headers=admin)
    assert r.status_code == 409
    # The hold stands while the rate stays at the resumed level...
    assert await guard.evaluate() == []
    assert (await states(gw))[DOMAIN]["state"] == "ok"
    # ...but a crossing of the higher level pauses everything at once.
    await window(gw, sends=200, status={"bounced": 150})
    changes = await guard.evaluate()
    assert [(c.from_state, c.to_state) for c in changes] == [("ok", "all_paused")]


async def test_the_send_path_reads_a_cached_view(providers_gateway: Gateway) -> None:
    """Another process's evaluation reaches this one through the state table, at the next
    refresh; between refreshes the send path asks nothing of the database."""
    gw = providers_gateway
    guard = gw.services.reputation
    assert await guard.verdict(DOMAIN, "marketing") is None  # first use loads the view
    await window(gw, sends=1000, status={"bounced": 50})
    async with pg_connection(gw.services.engine) as conn:
        from sender import reputation

        await reputation.evaluate(conn, guard.settings, now=guard.clock())
    # Not refreshed yet: still the old view.
    assert await guard.verdict(DOMAIN, "marketing") is None
    await guard.refresh()
    assert (await guard.verdict(DOMAIN, "marketing") or "").startswith(REASON_PREFIX)
    assert await guard.verdict(DOMAIN, "transactional") is None
    assert await guard.verdict(None, "marketing") is None


async def test_the_worker_sweep_evaluates_at_its_interval(providers_gateway: Gateway) -> None:
    gw = providers_gateway
    guard = gw.services.reputation
    clock = [1000.0]
    guard.monotonic = lambda: clock[0]
    start = utcnow()
    guard.clock = lambda: start + dt.timedelta(seconds=clock[0] - 1000.0)
    worker = build_worker(gw.services)
    await window(gw, sends=1000, status={"bounced": 50})
    await worker.sweep()
    assert (await states(gw))[DOMAIN]["state"] == "marketing_paused"
    await window(gw, sends=1000, status={"bounced": 200})
    await worker.sweep()  # within GATEWAY_REPUTATION_EVALUATE_SECONDS: not evaluated again
    assert (await states(gw))[DOMAIN]["state"] == "marketing_paused"
    # Another process evaluated just now (its row is recent): this one skips its turn.
    clock[0] += guard.settings.evaluate_seconds
    async with pg_connection(gw.services.engine) as conn:
        await conn.execute("UPDATE reputation_states SET evaluated_at = $1", guard.clock())
    await worker.sweep()
    assert (await states(gw))[DOMAIN]["state"] == "marketing_paused"
    clock[0] += guard.settings.evaluate_seconds
    await worker.sweep()
    assert (await states(gw))[DOMAIN]["state"] == "all_paused"


async def test_a_disabled_guard_evaluates_and_pauses_nothing(
    settings: Settings,
    ses_stub: SesStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> None:
    off = dataclasses.replace(settings.reputation, enabled=False)
    async with make_gateway(provider_settings(settings, reputation=off)) as gw:
        await window(gw, sends=1000, status={"bounced": 500})
        assert await gw.services.reputation.maybe_evaluate() == 0
        assert await states(gw) == {}
        r = await gw.send(_marketing(SUCCESS))
        assert r.status_code == 201 and ses_stub.count == 1


async def test_a_bounce_ses_made_for_its_own_suppression_list_is_not_counted(
    providers_gateway: Gateway, ses_stub: SesStub
) -> None:
    """End to end: real sends, real SES bounce events through the feedback path; the one
    with subtype OnAccountSuppressionList is a send but not a bounce, and mail to the SES
    mailbox simulator is not counted at all (SES does not count it either)."""
    gw = providers_gateway
    recipients = ("jane@example.com", "joe@example.com", "bounce@simulator.amazonses.com")
    pmids = []
    for to in recipients:
        r = await gw.send(email(to))
        assert r.status_code == 201, r.text
        view = await gw.client.get(r.headers["Location"], headers=gw.headers)
        pmids.append(view.json()["deliveries"][0]["provider_message_id"])
    for n, (to, pmid, subtype) in enumerate(
        zip(recipients, pmids, ("OnAccountSuppressionList", "General", "General"), strict=True)
    ):
        event = ses_event("Bounce", message_id=pmid, recipients=(to,), bounce_subtype=subtype)
        assert await gw.services.ingestor.ses_message(event, event_id=f"sns-{n}") == ["applied"]
    async with pg_connection(gw.services.engine) as conn:
        from sender import reputation

        counts = await reputation.window_counts(
            conn,
            since=utcnow() - dt.timedelta(hours=1),
            uncounted=gw.services.reputation.uncounted,
        )
    assert counts[DOMAIN] == ("email", reputation.Counts(sends=2, bounces=1, complaints=0))


async def test_metrics_publish_rates_and_states(providers_gateway: Gateway) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    gw = providers_gateway
    await window(gw, sends=1000, status={"bounced": 50, "complained": 1})
    await gw.services.reputation.evaluate()
    r = await gw.client.get("/metrics")
    assert r.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    ratio = "gateway_reputation_ratio"
    assert samples[(ratio, (("identity", DOMAIN), ("kind", "bounce")))] == 0.05
    assert samples[(ratio, (("identity", DOMAIN), ("kind", "complaint")))] == 0.001
    state = "gateway_reputation_state"
    assert samples[(state, (("identity", DOMAIN), ("state", "marketing_paused")))] == 1.0
    assert samples[(state, (("identity", DOMAIN), ("state", "ok")))] == 0.0
