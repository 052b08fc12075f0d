"""Subject access, erasure (no plaintext left anywhere, still suppressed) and key rotation."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from gateway import cli
from gateway.services import Services
from gateway.settings import Settings
from gateway.subjects import CIPHERTEXT_COLUMNS, SECRET_COLUMNS
from retry.models import DeadLetter
from sender.models import Attempt, Campaign, CampaignRecipient, Delivery, Message
from sender.providers.base import OutgoingMessage
from sender.providers.sandbox import FeedbackRunner, SandboxEmailProvider
from suppression import service
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import normalize
from suppression.tokens import issue_token
from tests.conftest import TEST_FERNET_KEYS, TEST_HASH_KEY, bearer
from webhooks.models import ProviderEvent

MakeKey = Callable[..., Awaitable[str]]
PERSON = "erase.me@example.com"
OTHER = "other.person@example.com"


async def _seed_person(services: Services, address: str, *, shared_with: str | None = None) -> None:
    """A message, delivery, attempt, event, dead letter and suppression for `address`.

    Provider texts quote the address the way real ones do (SMTP diagnostics, raw payloads).
    """
    p = services.protector
    h = p.hash("email", address)
    upper = address.upper()
    async with services.sessions() as s:
        message = Message(
            client_id=uuid.uuid4(),
            idempotency_key=f"welcome-{address}",
            fingerprint="f" * 64,
            channel="email",
            category="marketing",
            topic="marketing",
            content_encrypted=p.encrypt(json.dumps({"subject": "Hello", "text": f"Hi {address}"})),
            metadata_={"customer": {"email": upper}, "note": "vip"},
        )
        s.add(message)
        await s.flush()
        recipients = [address] + ([shared_with] if shared_with else [])
        deliveries = []
        for position, rcpt in enumerate(recipients):
            d = Delivery(
                message_id=message.id,
                position=position,
                channel="email",
                recipient_hash=p.hash("email", rcpt),
                recipient_encrypted=p.encrypt(rcpt),
                derived_key=uuid.uuid4().hex + uuid.uuid4().hex,
                status="bounced",
                reason=f"550 5.1.1 <{rcpt}>: Recipient address rejected",
                provider="ses",
                provider_message_id=f"ses-{uuid.uuid4()}",
                category="marketing",
                topic="marketing",
                last_error=f"bounced: {rcpt.upper()}",
            )
            s.add(d)
            deliveries.append(d)
        await s.flush()
        mine = deliveries[0]
        s.add(
            Attempt(
                delivery_id=mine.id,
                number=1,
                status="accepted",
                provider="ses",
                provider_message_id=mine.provider_message_id,
                error_message=f"soft failure for {address}",
            )
        )
        raw = {"notificationType": "Bounce", "mail": {"destination": [address]}}
        s.add(
            ProviderEvent(
                provider="ses",
                provider_event_id=f"evt-{uuid.uuid4()}",
                event_type="bounced",
                provider_message_id=mine.provider_message_id,
                delivery_id=mine.id,
                recipient_hash=h,
                disposition="applied",
                details={"bounce_type": "Permanent", "diagnostic": f"smtp; 550 {address}"},
                payload_encrypted=p.encrypt(json.dumps(raw)),
            )
        )
        # an inbound event that reached no delivery (matched by the hash only)
        s.add(
            ProviderEvent(
                provider="ses",
                provider_event_id=f"evt-{uuid.uuid4()}",
                event_type="complained",
                recipient_hash=h,
                disposition="parked",
                details={},
                payload_encrypted=p.encrypt(json.dumps({"complainedRecipients": [address]})),
            )
        )
        s.add(
            DeadLetter(
                delivery_id=mine.id,
                channel="email",
                reason="max_attempts",
                last_error=f"gave up on {address}",
                attempt_history=[{"number": 1, "error": f"timeout sending to {address}"}],
            )
        )
        await service.add(
            s,
            p,
            normalize("email", address),
            reason="hard_bounce",
            source=service.Source("provider_event", "evt-x", evidence={"diagnostic": "550"}),
        )
        await s.commit()
    # What the sandbox mailbox keeps of a message to the address (no callbacks delivered).
    assert services.sandbox_mailbox is not None
    runner = FeedbackRunner(None, store=services.sandbox_mailbox.mailbox)
    await SandboxEmailProvider(runner).send(
        OutgoingMessage(
            delivery_id=mine.id,
            derived_key=mine.derived_key,
            channel="email",
            to=address,
            subject="Hello",
            text=f"Hi {address}",
        )
    )
    await runner.drain()


async def _unsubscribe(client: httpx.AsyncClient, services: Services, address: str) -> None:
    token = issue_token(
        services.protector, channel="email", address=address, topic="marketing", delivery_id=None
    )
    r = await client.post(
        f"/unsubscribe/{token}",
        data={"List-Unsubscribe": "One-Click"},
        headers={"User-Agent": "Mozilla/5.0 (Personal Device)"},
    )
    assert r.status_code == 200


async def _plaintext_hits(
    session: AsyncSession, needle: str, *, compact: bool = False
) -> list[str]:
    """Every (table.column) of the public schema whose text contains `needle`, any case
    (`compact`: after removing blanks, brackets, dots and dashes, as in phone numbers)."""
    columns = (
        await session.execute(
            text(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = 'public' AND data_type IN"
                " ('text', 'character varying', 'character', 'json', 'jsonb', 'ARRAY')"
            )
        )
    ).all()
    assert len(columns) > 20  # every table's text columns are really searched
    hits = []
    for table, column in columns:
        value = f'"{column}"::text'
        if compact:
            value = rf"regexp_replace({value}, '[\s().-]', '', 'g')"
        found = await session.execute(
            text(f'SELECT count(*) FROM "{table}" WHERE {value} ILIKE :pattern'),
            {"pattern": f"%{needle}%"},
        )
        if found.scalar_one():
            hits.append(f"{table}.{column}")
    return hits


async def _decrypted_hits(session: AsyncSession, services: Services, needle: str) -> list[str]:
    """Ciphertext columns whose decrypted value contains `needle`."""
    hits = []
    for model, column, _ in CIPHERTEXT_COLUMNS:
        values = (await session.execute(select(getattr(model, column)))).scalars().all()
        for value in values:
            if value is not None and needle in services.protector.decrypt(value).lower():
                hits.append(f"{model.__tablename__}.{column}")
    return hits


async def test_erasure_leaves_no_plaintext_and_the_person_stays_suppressed(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed_person(services, PERSON, shared_with=OTHER)
    await _unsubscribe(client, services, PERSON)
    async with services.sessions() as s:
        before = await _plaintext_hits(s, PERSON)
        assert {"deliveries.reason", "messages.metadata", "dead_letters.attempt_history"} <= set(
            before
        )
        assert "messages.content_encrypted" in await _decrypted_hits(s, services, PERSON)
        assert "sandbox_messages.content_encrypted" in await _decrypted_hits(s, services, PERSON)

    admin = bearer(await make_key("admin"))
    r = await client.delete("/v1/subjects/email/Erase.Me@EXAMPLE.com", headers=admin)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["still_suppressed"] is True
    assert report["ciphertexts_destroyed"] == {
        "deliveries": 1,
        "suppressions": 2,
        "provider_events": 2,
        "messages": 0,  # the content was also sent to OTHER, so it stays
        "sandbox_messages": 1,
        "campaign_recipients": 0,
        # the outbox's copies: the delivery's events and the suppression entries' added
        "events": 3,
    }
    async with services.sessions() as s:
        assert await _plaintext_hits(s, PERSON) == []
        assert await _decrypted_hits(s, services, PERSON) == []
        # the other recipient's data is untouched
        assert "deliveries.reason" in await _plaintext_hits(s, OTHER)
        assert "deliveries.recipient_encrypted" in await _decrypted_hits(s, services, OTHER)
        # personal evidence of the unsubscribe is gone from entries and history
        evidence = (await s.execute(select(Suppression.evidence))).scalars().all()
        details = (await s.execute(select(SuppressionHistory.details))).scalars().all()
        dumped = json.dumps([evidence, details])
        assert "Personal Device" not in dumped and "203.0.113.7" not in dumped
        assert "token_issued_at" in dumped  # non-personal evidence stays
        actions = (
            (await s.execute(select(SuppressionHistory.action).order_by(SuppressionHistory.id)))
            .scalars()
            .all()
        )
        assert actions == ["add", "add", "erase"]
        # still suppressed, by hash
        h = services.protector.hash("email", PERSON)
        hit = await service.check(s, "email", h, category="transactional")
        assert hit is not None and hit.reason == "hard_bounce"

    reader = bearer(await make_key("read"))
    r = await client.get(f"/v1/suppressions/email/{PERSON}", headers=reader)
    assert r.json()["suppressed"] is True
    assert [e["address"] for e in r.json()["entries"]] == [None, None]

    # A later import of the same address cannot re-enable sending nor bring the address back.
    body = f"EmailAddress,Reason\n{PERSON},BOUNCE\n{PERSON.upper()},COMPLAINT\n"
    r = await client.post("/v1/suppressions/import", content=body.encode(), headers=admin)
    assert (r.json()["added"], r.json()["already_present"]) == (0, 2)
    ours = f"channel,address,scope,reason\nemail,{PERSON},news,unsubscribe\n"
    r = await client.post("/v1/suppressions/import", content=ours.encode(), headers=admin)
    assert r.json()["added"] == 1
    async with services.sessions() as s:
        await service.add(
            s,
            services.protector,
            normalize("email", PERSON),
            reason="unsubscribe",
            scope="promo",
            source=service.Source("unsubscribe"),
        )
        await s.commit()
        assert await _plaintext_hits(s, PERSON) == []
        assert await _decrypted_hits(s, services, PERSON) == []
        rows = (await s.execute(select(Suppression.scope, Suppression.address_encrypted))).all()
        assert sorted(scope for scope, _ in rows) == ["all", "marketing", "news", "promo"]
        assert {enc for _, enc in rows} == {None}


async def test_erasure_of_a_single_recipient_message_destroys_its_content(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed_person(services, PERSON)
    r = await client.delete(f"/v1/subjects/email/{PERSON}", headers=bearer(await make_key("admin")))
    assert r.json()["ciphertexts_destroyed"]["messages"] == 1
    async with services.sessions() as s:
        content = (await s.execute(select(Message.content_encrypted))).scalar_one()
        assert content is None
        assert await _plaintext_hits(s, PERSON) == []
        # idempotency key and metadata keep their non-personal parts
        message = (await s.execute(select(Message))).scalar_one()
        assert message.idempotency_key == "welcome-[erased]"
        assert message.metadata_ == {"customer": {"email": "[erased]"}, "note": "vip"}


async def test_erasure_of_a_phone_number_catches_formatted_spellings(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    p = services.protector
    number = "+12025550143"
    async with services.sessions() as s:
        message = Message(
            client_id=uuid.uuid4(),
            idempotency_key="otp-202-555-0143",
            fingerprint="f" * 64,
            channel="sms",
            content_encrypted=p.encrypt(json.dumps({"body": "Your code is 123456"})),
            metadata_={"phone": "(202) 555-0143"},
        )
        s.add(message)
        await s.flush()
        delivery = Delivery(
            message_id=message.id,
            channel="sms",
            recipient_hash=p.hash("sms", number),
            recipient_encrypted=p.encrypt(number),
            derived_key=uuid.uuid4().hex * 2,
            status="failed",
            provider="twilio",
            last_error="21610: Attempt to send to unsubscribed recipient +1 202-555-0143",
        )
        s.add(delivery)
        await s.flush()
        s.add(
            ProviderEvent(
                provider="twilio",
                provider_event_id="SM-status-1",
                event_type="inbound",
                recipient_hash=p.hash("sms", number),
                delivery_id=delivery.id,
                disposition="applied",
                details={"from": number, "keyword": "STOP"},
                payload_encrypted=p.encrypt(f"From=%2B12025550143&Body=STOP&To={number}"),
            )
        )
        await service.add(
            s, p, normalize("sms", number), reason="sms_stop", source=service.Source("inbound")
        )
        await s.commit()

    async def compact_hits() -> list[str]:
        # the digits, whatever separators the text put between them
        async with services.sessions() as s:
            return [
                hit
                for hit in await _plaintext_hits(s, "2025550143", compact=True)
                if not hit.startswith("alembic")
            ]

    assert {"deliveries.last_error", "messages.metadata", "messages.idempotency_key"} <= set(
        await compact_hits()
    )
    r = await client.delete(
        "/v1/subjects/sms/(202) 555-0143", headers=bearer(await make_key("admin"))
    )
    assert r.status_code == 200 and r.json()["still_suppressed"] is True
    assert await compact_hits() == []
    async with services.sessions() as s:
        assert await _decrypted_hits(s, services, "2025550143") == []
        hit = await service.check(s, "sms", p.hash("sms", number), category="transactional")
        assert hit is not None and hit.reason == "sms_stop"


async def test_subject_access_returns_everything_decrypted(
    client: httpx.AsyncClient, services: Services, make_key: MakeKey
) -> None:
    await _seed_person(services, PERSON, shared_with=OTHER)
    await _seed_person(services, OTHER)
    await _unsubscribe(client, services, PERSON)
    await _seed_campaign_list(services, OTHER, PERSON)
    key = bearer(await make_key("export"))
    r = await client.get("/v1/subjects/email/ERASE.ME@example.com", headers=key)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["address"] == PERSON and data["suppressed"] is True
    (delivery,) = data["deliveries"]
    assert delivery["recipient"] == PERSON and "recipient_hash" not in delivery
    assert delivery["status"] == "bounced"
    assert [a["error_message"] for a in delivery["attempts"]] == [f"soft failure for {PERSON}"]
    (event,) = delivery["events"]
    assert event["payload"]["mail"]["destination"] == [PERSON]
    assert delivery["dead_letters"][0]["reason"] == "max_attempts"
    (message,) = data["messages"]
    assert message["content"] == {"subject": "Hello", "text": f"Hi {PERSON}"}
    assert [e["payload"] for e in data["events"]] == [{"complainedRecipients": [PERSON]}]
    assert sorted((e["reason"], e["scope"]) for e in data["suppressions"]) == [
        ("hard_bounce", "all"),
        ("unsubscribe", "marketing"),
    ]
    assert data["suppressions"][0]["address"] == PERSON
    assert [h["action"] for h in data["history"]] == ["add", "add"]
    assert OTHER not in json.dumps(data["deliveries"])  # the other recipient's delivery is not here
    # The outbound events about the person: its delivery's status and its suppressions.
    assert [(e["type"], e["address"]) for e in data["outbound_events"]] == [
        ("delivery.bounced", PERSON),
        ("suppression.added", PERSON),
        ("suppression.added", PERSON),
    ]
    assert data["outbound_events"][0]["delivery_id"] == delivery["id"]
    (listed,) = data["campaign_recipients"]
    assert listed["recipient"] == PERSON and listed["position"] == 1
    assert "recipient_hash" not in listed
    # The sandbox mailbox's copies of what was sent to the person, decrypted.
    assert data["sandbox_messages"]
    assert all("content" in m and "to_hash" not in m for m in data["sandbox_messages"])
    assert OTHER not in json.dumps(
        [data["outbound_events"], data["campaign_recipients"], data["sandbox_messages"]]
    )

    assert (
        await client.get(f"/v1/subjects/email/{PERSON}", headers=bearer(await make_key("read")))
    ).status_code == 403
    assert (await client.get("/v1/subjects/email/not-an-address", headers=key)).status_code == 422
    assert (await client.get(f"/v1/subjects/fax/{PERSON}", headers=key)).status_code == 400
    r = await client.get("/v1/subjects/sms/+12025550143", headers=key)
    assert r.status_code == 200 and r.json()["deliveries"] == [] and r.json()["suppressed"] is False


async def _seed_campaign_list(services: Services, *addresses: str) -> None:
    """A campaign (on the first message there is) whose uploaded list names `addresses`
    (rows with a composite primary key)."""
    p = services.protector
    async with services.sessions() as s:
        message = await s.scalar(select(Message).limit(1))
        assert message is not None
        campaign = Campaign(
            client_id=message.client_id,
            idempotency_key="sale",
            fingerprint="f" * 64,
            message_id=message.id,
            read_count=len(addresses),
        )
        s.add(campaign)
        await s.flush()
        for position, rcpt in enumerate(addresses):
            s.add(
                CampaignRecipient(
                    campaign_id=campaign.id,
                    position=position,
                    recipient_hash=p.hash("email", rcpt),
                    recipient_encrypted=p.encrypt(rcpt),
                    derived_key=uuid.uuid4().hex + uuid.uuid4().hex,
                )
            )
        await s.commit()


def _env(settings: Settings, keys: tuple[str, ...]) -> dict[str, str]:
    assert settings.database_url is not None
    return {
        "DATABASE_URL": settings.database_url,
        "GATEWAY_SECRET_KEYS": ",".join(keys),
        "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(TEST_HASH_KEY).decode(),
        "GATEWAY_LOG_LEVEL": "WARNING",
    }


async def test_rotate_encryption_reencrypts_every_ciphertext_with_the_newest_key(
    settings: Settings,
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await _seed_person(services, PERSON, shared_with=OTHER)
    await _seed_campaign_list(services, PERSON, OTHER, "third@example.org")
    async with services.sessions() as s:
        # one value under the second (older) key, and one no key can read
        await s.execute(
            text(
                "UPDATE provider_events SET payload_encrypted = :v WHERE event_type = 'complained'"
            ),
            {"v": Fernet(TEST_FERNET_KEYS[1].encode()).encrypt(b'{"old": true}').decode()},
        )
        await s.commit()
    async with services.sessions() as s:
        before = {
            f"{m.__tablename__}.{c}": sorted(
                services.protector.decrypt(v)
                for v in (await s.execute(select(getattr(m, c)))).scalars()
                if v
            )
            for m, c, _ in CIPHERTEXT_COLUMNS
        }
    newest = Fernet.generate_key().decode()
    for name, value in _env(settings, (newest, *TEST_FERNET_KEYS)).items():
        monkeypatch.setenv(name, value)
    code = await asyncio.to_thread(cli.main, ["keys", "rotate-encryption", "--batch-size", "2"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "deliveries.recipient_encrypted [" in err and "100%" in err
    assert "deliveries.recipient_encrypted: 2 rotated, 0 already current" in err

    only_newest = Fernet(newest.encode())
    async with services.sessions() as s:
        for model, column, _ in CIPHERTEXT_COLUMNS:
            values = [v for v in (await s.execute(select(getattr(model, column)))).scalars() if v]
            assert values
            plain = sorted(only_newest.decrypt(v.encode()).decode() for v in values)
            assert plain == before[f"{model.__tablename__}.{column}"]

    # a second run has nothing left to do
    code = await asyncio.to_thread(cli.main, ["keys", "rotate-encryption"])
    err = capsys.readouterr().err
    assert code == 0 and "suppressions.address_encrypted: 0 rotated, 1 already current" in err

    # a value no configured key can read is reported and left alone (exit status 1)
    unreadable = Fernet(Fernet.generate_key()).encrypt(b"lost").decode()
    async with services.sessions() as s:
        await s.execute(text("UPDATE messages SET content_encrypted = :v"), {"v": unreadable})
        await s.commit()
    code = await asyncio.to_thread(cli.main, ["keys", "rotate-encryption"])
    assert code == 1 and "1 undecryptable" in capsys.readouterr().err
    async with services.sessions() as s:
        assert (await s.execute(select(Message.content_encrypted))).scalar_one() == unreadable
        with pytest.raises(InvalidToken):
            only_newest.decrypt(unreadable.encode())


def test_ciphertext_registry_covers_every_encrypted_column() -> None:
    from suppression.db import Base

    encrypted = {
        f"{table.name}.{column.name}"
        for table in Base.metadata.sorted_tables
        for column in table.columns
        if column.name.endswith("_encrypted")
    }
    registered = (*CIPHERTEXT_COLUMNS, *SECRET_COLUMNS)
    assert encrypted == {f"{m.__tablename__}.{c}" for m, c, _ in registered}
