"""Personal data across every table: subject access, erasure, and key rotation of ciphertexts.

Only the composition root may touch every package's tables, so this lives in `gateway`.

* Access (`GET /v1/subjects/{channel}/{address}`, scope `export`): everything held about one
  address, with ciphertexts decrypted: deliveries with their attempts, provider events and
  dead letters, the upstream messages, suppression entries and history.
* Erasure (`DELETE /v1/subjects/{channel}/{address}`, scope `admin`): every ciphertext that
  belongs to the address is destroyed (set to NULL) and every spelling of the address is
  scrubbed from the text and JSON columns of the related rows (provider error messages and
  metadata quote addresses). Hashes stay, so suppression entries keep suppressing; an `erase`
  row in the suppression history makes later adds and imports store the hash only. The
  unsubscribe evidence that is the person's own data (user agent, client IP) is removed from
  entries and history; this is the one update history rows ever get. A message's content is
  destroyed when the message was addressed to this person only; content shared with other
  recipients is kept (it is theirs too), with this person's address scrubbed from inside it.
* Rotation (`gateway keys rotate-encryption`): re-encrypt every ciphertext column with the
  newest key, in batches, skipping values that already use it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from litestar import Controller, Request, delete, get
from litestar.exceptions import HTTPException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter
from sqlalchemy import (
    JSON,
    ColumnElement,
    String,
    Table,
    Text,
    and_,
    cast,
    exists,
    func,
    inspect,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.sql.expression import bindparam

from gateway.auth import principal_of
from gateway.services import Services
from retry.models import DeadLetter
from sender.models import Attempt, CampaignRecipient, Delivery, Event, Message, SandboxMessage
from suppression.crypto import AddressProtector, InvalidToken
from suppression.db import Base
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import CHANNELS, Address, InvalidAddress, normalize
from suppression.service import (
    ERASE_ACTION,
    PERSONAL_EVIDENCE_KEYS,
    SCOPE_ALL,
    address_patterns,
)
from suppression.views import EntryView, HistoryView, entry_view, history_view, jsonable
from webhooks.models import ProviderEvent
from webhooks.outbound.models import WebhookEndpoint

# Every column that holds Fernet ciphertext, with the name its plaintext gets in access output.
CIPHERTEXT_COLUMNS: tuple[tuple[type[Base], str, str], ...] = (
    (Delivery, "recipient_encrypted", "recipient"),
    (Suppression, "address_encrypted", "address"),
    (ProviderEvent, "payload_encrypted", "payload"),
    (Message, "content_encrypted", "content"),
    (SandboxMessage, "content_encrypted", "content"),
    (CampaignRecipient, "recipient_encrypted", "recipient"),
    # Outbound events keep a copy of the address they report (sender.events).
    (Event, "address_encrypted", "address"),
)
_CIPHERTEXT = {(model.__tablename__, column) for model, column, _ in CIPHERTEXT_COLUMNS}
# Ciphertexts that are nobody's personal data (webhook signing secrets): re-encrypted by a key
# rotation, never part of a subject's access or erasure.
SECRET_COLUMNS: tuple[tuple[type[Base], str, str], ...] = (
    (WebhookEndpoint, "secret_encrypted", "secret"),
    (WebhookEndpoint, "previous_secret_encrypted", "previous_secret"),
)
REDACTED = "[erased]"


@dataclass(frozen=True)
class Subject:
    """A person, as one normalized address on one channel."""

    address: Address
    address_hash: str
    # Every spelling to scrub from text (case-insensitively): normalized, as given, variants.
    spellings: tuple[str, ...]

    @property
    def channel(self) -> str:
        """The address's channel."""
        return self.address.channel


def subject_for(
    protector: AddressProtector, channel: str, raw: str, default_region: str = "US"
) -> Subject:
    """Normalize an address into a subject; raises `InvalidAddress` (or ValueError)."""
    address = normalize(channel, raw, default_region)
    spellings = {address.key, address.display, raw.strip()}
    if channel == "email":
        local, _, domain = address.key.rpartition("@")
        if "xn--" in domain:
            try:
                spellings.add(f"{local}@{domain.encode('ascii').decode('idna')}")
            except UnicodeError:
                pass
    else:
        spellings.add(address.key.lstrip("+"))
    # NUL cannot appear in PostgreSQL text (nor in a pattern matched against it).
    unique = sorted(
        {s.lower().replace("\x00", "") for s in spellings if s} - {""}, key=len, reverse=True
    )
    return Subject(address, protector.hash(channel, address.key), tuple(unique))


def _pattern(subject: Subject) -> str:
    # `re.escape` output is also a literal in PostgreSQL's regular expressions (it escapes only
    # non-alphanumerics, and `\` + non-alphanumeric is that character there too); the phone
    # patterns of `address_patterns` are written for both engines.
    patterns = [re.escape(s) for s in subject.spellings]
    if subject.channel == "sms":
        patterns = address_patterns(subject.address) + patterns
    return "|".join(patterns)


# --- which rows belong to a subject ------------------------------------------------------------


async def _delivery_ids(session: AsyncSession, subject: Subject) -> list[uuid.UUID]:
    rows = await session.execute(
        select(Delivery.id).where(
            Delivery.channel == subject.channel, Delivery.recipient_hash == subject.address_hash
        )
    )
    return list(rows.scalars())


def _related(
    subject: Subject, delivery_ids: list[uuid.UUID]
) -> dict[type[Base], ColumnElement[bool]]:
    """Per table, the condition selecting the rows that concern the subject."""
    message_ids = select(Delivery.message_id).where(Delivery.id.in_(delivery_ids))
    return {
        Delivery: Delivery.id.in_(delivery_ids),
        Attempt: Attempt.delivery_id.in_(delivery_ids),
        DeadLetter: DeadLetter.delivery_id.in_(delivery_ids),
        Message: Message.id.in_(message_ids),
        ProviderEvent: or_(
            ProviderEvent.recipient_hash == subject.address_hash,
            ProviderEvent.delivery_id.in_(delivery_ids),
        ),
        Suppression: and_(
            Suppression.channel == subject.channel,
            Suppression.address_hash == subject.address_hash,
        ),
        SuppressionHistory: and_(
            SuppressionHistory.channel == subject.channel,
            SuppressionHistory.address_hash == subject.address_hash,
        ),
        # Campaign lists (the hash is channel-scoped, so it names the channel too).
        CampaignRecipient: CampaignRecipient.recipient_hash == subject.address_hash,
        # The sandbox mailbox's copies of what was sent to the subject.
        SandboxMessage: and_(
            SandboxMessage.channel == subject.channel,
            SandboxMessage.to_hash == subject.address_hash,
        ),
        # Outbound events about the subject's deliveries and suppression entries.
        Event: or_(
            and_(Event.channel == subject.channel, Event.address_hash == subject.address_hash),
            Event.delivery_id.in_(delivery_ids),
        ),
    }


# --- access ------------------------------------------------------------------------------------


@dataclass
class SubjectData:
    """Everything held about one address (ciphertexts decrypted)."""

    channel: str
    address: str
    suppressed: bool
    suppressions: list[EntryView]
    history: list[HistoryView]
    deliveries: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    events: list[dict[str, Any]]
    # The outbound events (the feed and webhooks) about the person's deliveries and entries.
    outbound_events: list[dict[str, Any]]
    # The person's rows in campaign lists (with the metadata uploaded with them).
    campaign_recipients: list[dict[str, Any]]
    # The sandbox mailbox's copies of what was sent to the person.
    sandbox_messages: list[dict[str, Any]]


def _decrypt(protector: AddressProtector, token: str | None) -> Any:
    if token is None:
        return None
    try:
        text = protector.decrypt(token)
    except InvalidToken:
        return {"undecryptable": True}
    try:
        return json.loads(text)
    except ValueError:
        return text


def _row(protector: AddressProtector, row: Base, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every column of a row under its column name; ciphertexts decrypted under a plain name."""
    table = row.__table__.name  # type: ignore[attr-defined]
    plain = {(m.__tablename__, c): name for m, c, name in CIPHERTEXT_COLUMNS}
    out: dict[str, Any] = {}
    for attr in inspect(type(row)).column_attrs:
        name = attr.columns[0].name
        if name in skip:
            continue
        value = getattr(row, attr.key)
        if (table, name) in _CIPHERTEXT:
            out[plain[(table, name)]] = _decrypt(protector, value)
        else:
            out[name] = jsonable(value)
    return out


async def access(
    session: AsyncSession, protector: AddressProtector, subject: Subject
) -> SubjectData:
    """Collect everything about the subject."""
    delivery_ids = await _delivery_ids(session, subject)
    where = _related(subject, delivery_ids)

    async def rows(model: type[Base], *order: Any) -> list[Any]:
        result = await session.execute(select(model).where(where[model]).order_by(*order))
        return list(result.scalars())

    deliveries = await rows(Delivery, Delivery.created_at)
    attempts = await rows(Attempt, Attempt.number)
    dead = await rows(DeadLetter, DeadLetter.created_at)
    events = await rows(ProviderEvent, ProviderEvent.received_at)
    messages = await rows(Message, Message.created_at)
    entries = await rows(Suppression, Suppression.created_at)
    history = await rows(SuppressionHistory, SuppressionHistory.id)
    outbound = await rows(Event, Event.id)
    lists = await rows(CampaignRecipient, CampaignRecipient.campaign_id, CampaignRecipient.position)
    sandbox = await rows(SandboxMessage, SandboxMessage.created_at)
    now = dt.datetime.now(dt.UTC)

    out_deliveries = []
    for delivery in deliveries:
        item = _row(protector, delivery, skip=("recipient_hash",))
        item["attempts"] = [_row(protector, a) for a in attempts if a.delivery_id == delivery.id]
        item["events"] = [_row(protector, e) for e in events if e.delivery_id == delivery.id]
        item["dead_letters"] = [_row(protector, d) for d in dead if d.delivery_id == delivery.id]
        out_deliveries.append(item)
    linked = set(delivery_ids)
    views = [entry_view(protector, e, now) for e in entries]
    return SubjectData(
        channel=subject.channel,
        address=subject.address.key,
        suppressed=any(v.active for v in views),
        suppressions=views,
        history=[history_view(h) for h in history],
        deliveries=out_deliveries,
        messages=[_row(protector, m) for m in messages],
        # Events that reached no delivery of this person (e.g. parked, or inbound STOP).
        events=[_row(protector, e) for e in events if e.delivery_id not in linked],
        outbound_events=[_row(protector, e, skip=("address_hash",)) for e in outbound],
        campaign_recipients=[_row(protector, r, skip=("recipient_hash",)) for r in lists],
        sandbox_messages=[_row(protector, m, skip=("to_hash",)) for m in sandbox],
    )


# --- erasure -----------------------------------------------------------------------------------


@dataclass
class ErasureReport:
    """What an erasure destroyed; `still_suppressed` tells whether the hash still suppresses."""

    ciphertexts_destroyed: dict[str, int] = field(default_factory=dict)
    text_values_scrubbed: int = 0
    still_suppressed: bool = False


async def erase(
    session: AsyncSession,
    protector: AddressProtector,
    subject: Subject,
    *,
    actor: str,
    now: dt.datetime | None = None,
) -> ErasureReport:
    """Destroy the subject's ciphertexts and plaintext mentions; keep hashes. Caller commits."""
    now = now or dt.datetime.now(dt.UTC)
    report = ErasureReport()
    delivery_ids = await _delivery_ids(session, subject)
    where = _related(subject, delivery_ids)

    # Content shared with other recipients' deliveries is theirs too and stays.
    others = exists().where(
        Delivery.message_id == Message.id,
        or_(Delivery.channel != subject.channel, Delivery.recipient_hash != subject.address_hash),
    )
    ciphertext_where: dict[type[Base], ColumnElement[bool]] = {
        **where,
        Message: and_(where[Message], ~others),
    }
    for model, column, _ in CIPHERTEXT_COLUMNS:
        col = getattr(model, column)
        result = await session.execute(
            update(model)
            .where(ciphertext_where[model], col.is_not(None))
            .values({column: None})
            .execution_options(synchronize_session=False)
        )
        report.ciphertexts_destroyed[model.__tablename__] = result.rowcount  # type: ignore[attr-defined]

    pattern = _pattern(subject)
    # Shared content is kept, but the subject's address is scrubbed from inside it too.
    shared = await session.execute(
        select(Message.id, Message.content_encrypted).where(
            where[Message], others, Message.content_encrypted.is_not(None)
        )
    )
    matcher = re.compile(pattern, re.IGNORECASE)
    for message_id, token in shared.all():
        try:
            plain = protector.decrypt(token or "")
        except InvalidToken:
            continue
        scrubbed, found = matcher.subn(REDACTED, plain)
        if found:
            await session.execute(
                update(Message)
                .where(Message.id == message_id)
                .values(content_encrypted=protector.encrypt(scrubbed))
                .execution_options(synchronize_session=False)
            )
            report.text_values_scrubbed += 1
    for model, condition in where.items():
        table = _table(model)
        for target in table.columns:
            if (model.__tablename__, target.name) in _CIPHERTEXT:
                continue
            if isinstance(target.type, JSON | JSONB):
                as_text: Any = cast(target, Text)
                new_value: Any = cast(func.regexp_replace(as_text, pattern, REDACTED, "gi"), JSONB)
            elif isinstance(target.type, String | Text):
                as_text = target
                new_value = func.regexp_replace(target, pattern, REDACTED, "gi")
            else:
                continue
            result = await session.execute(
                update(table)
                .where(condition, as_text.op("~*")(pattern))
                .values({target.name: new_value})
            )
            report.text_values_scrubbed += result.rowcount  # type: ignore[attr-defined]

    # A campaign list's per-recipient metadata is the person's own data: it goes with the
    # address (whose hash stays, so an expansion still creates the delivery, which then
    # fails as `recipient erased` without a provider call).
    await session.execute(
        update(CampaignRecipient)
        .where(where[CampaignRecipient], CampaignRecipient.metadata_.is_not(None))
        .values(metadata_=None)
        .execution_options(synchronize_session=False)
    )

    evidence_keys = list(PERSONAL_EVIDENCE_KEYS)
    await session.execute(
        update(Suppression)
        .where(where[Suppression])
        .values(evidence=Suppression.evidence.op("-")(cast(evidence_keys, _text_array())))
        .execution_options(synchronize_session=False)
    )
    await session.execute(
        update(SuppressionHistory)
        .where(
            where[SuppressionHistory],
            func.jsonb_typeof(SuppressionHistory.details["evidence"]) == "object",
        )
        .values(
            details=func.jsonb_set(
                SuppressionHistory.details,
                cast(["evidence"], _text_array()),
                SuppressionHistory.details["evidence"].op("-")(cast(evidence_keys, _text_array())),
            )
        )
        .execution_options(synchronize_session=False)
    )
    active = await session.execute(
        select(func.count())
        .select_from(Suppression)
        .where(
            where[Suppression],
            or_(Suppression.expires_at.is_(None), Suppression.expires_at > now),
        )
    )
    report.still_suppressed = active.scalar_one() > 0
    session.add(
        SuppressionHistory(
            suppression_id=None,
            channel=subject.channel,
            address_hash=subject.address_hash,
            scope=SCOPE_ALL,
            action=ERASE_ACTION,
            reason="erasure",
            actor=actor,
            source_type="operator",
            source_id=actor,
            details={
                "ciphertexts_destroyed": report.ciphertexts_destroyed,
                "text_values_scrubbed": report.text_values_scrubbed,
            },
            at=now,
        )
    )
    await session.flush()
    return report


def _table(model: type[Base]) -> Table:
    return typing.cast(Table, model.__table__)


def _text_array() -> Any:
    from sqlalchemy.dialects.postgresql import ARRAY

    return ARRAY(Text)


# --- key rotation ------------------------------------------------------------------------------


@dataclass
class RotationReport:
    """Per column: values re-encrypted, already current, and undecryptable (left as they are)."""

    rotated: dict[str, int] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)


async def rotate_encryption(
    sessions: async_sessionmaker[AsyncSession],
    protector: AddressProtector,
    *,
    batch_size: int = 500,
    progress: Callable[[str, int, int], None] | None = None,
) -> RotationReport:
    """Re-encrypt every ciphertext column with the newest key, batch by batch.

    Each batch is its own short transaction; a value changed concurrently is left alone (the
    update matches on the old ciphertext), so the command is safe on a live system and can be
    re-run: values already under the newest key are skipped.
    """
    report = RotationReport()
    for model, column, _ in (*CIPHERTEXT_COLUMNS, *SECRET_COLUMNS):
        table = _table(model)
        label = f"{table.name}.{column}"
        col = table.c[column]
        async with sessions() as session:
            counted = select(func.count()).select_from(table).where(col.is_not(None))
            total = (await session.execute(counted)).scalar_one()
        rotated = current = failed = done = 0
        if progress:
            progress(label, 0, total)
        # Keyset over the primary key (one column, or several: campaign_recipients).
        key = list(table.primary_key.columns)
        stmt = (
            update(table)
            .where(*(c == bindparam(f"b_{c.name}") for c in key), col == bindparam("b_old"))
            .values({column: bindparam("b_new")})
        )
        last: tuple[Any, ...] | None = None
        while True:
            async with sessions() as session:
                query = select(*key, col).where(col.is_not(None)).order_by(*key)
                if last is not None:
                    query = query.where(tuple_(*key) > tuple_(*last))
                batch = list((await session.execute(query.limit(batch_size))).all())
                if not batch:
                    break
                changes = []
                for *row_key, token in batch:
                    if protector.is_current(token):
                        current += 1
                        continue
                    try:
                        new = protector.rotate(token)
                    except InvalidToken:
                        failed += 1
                        continue
                    ids = {f"b_{c.name}": v for c, v in zip(key, row_key, strict=True)}
                    changes.append({**ids, "b_old": token, "b_new": new})
                if changes:
                    connection = await session.connection()
                    await connection.execute(stmt, changes)
                    rotated += len(changes)
                await session.commit()
            last = tuple(batch[-1][: len(key)])
            done += len(batch)
            if progress:
                progress(label, min(done, total), total)
        report.rotated[label] = rotated
        report.current[label] = current
        report.failed[label] = failed
    return report


# --- routes ------------------------------------------------------------------------------------


def _subject(services: Services, channel: str, address: str) -> Subject:
    if channel not in CHANNELS:
        raise HTTPException(
            status_code=400,
            detail=f"channel must be one of {', '.join(CHANNELS)}",
            extra={"type": "urn:problem:unknown-channel"},
        )
    try:
        return subject_for(services.protector, channel, address, services.settings.default_region)
    except InvalidAddress as exc:
        raise HTTPException(
            status_code=422,
            detail=f"not a valid {channel} address: {exc.problem}",
            extra={"type": "urn:problem:invalid-address"},
        ) from None


# OpenAPI: what `_subject` accepts.
_CHANNEL = Parameter(schema_extra={"enum": list(CHANNELS)})
_INVALID_ADDRESS = ResponseSpec(
    None, description="Not a valid address for the channel (urn:problem:invalid-address)"
)


@dataclass
class ErasureResult:
    """Response of an erasure."""

    channel: str
    ciphertexts_destroyed: dict[str, int]
    text_values_scrubbed: int
    still_suppressed: bool


class SubjectsController(Controller):
    """Access to and erasure of one person's data."""

    path = "/v1/subjects"
    tags = ["subjects"]

    @get(
        "/{channel:str}/{address:str}",
        opt={"scope": "export"},
        summary="Everything held about one address",
        responses={422: _INVALID_ADDRESS},
    )
    async def get_subject(
        self,
        channel: Annotated[str, _CHANNEL],
        address: str,
        services: Services,
        db_session: AsyncSession,
    ) -> SubjectData:
        """Deliveries, attempts, events, messages, suppressions and history, decrypted."""
        subject = _subject(services, channel, address)
        return await access(db_session, services.protector, subject)

    @delete(
        "/{channel:str}/{address:str}",
        opt={"scope": "admin"},
        status_code=200,
        summary="Erase one address (ciphertexts destroyed, hashes kept)",
        responses={422: _INVALID_ADDRESS},
    )
    async def erase_subject(
        self,
        channel: Annotated[str, _CHANNEL],
        address: str,
        request: Request[Any, Any, Any],
        services: Services,
        db_session: AsyncSession,
    ) -> ErasureResult:
        """Destroy every ciphertext and plaintext mention; the person stays suppressed."""
        subject = _subject(services, channel, address)
        actor = f"api_key:{principal_of(request).key_id}"
        report = await erase(db_session, services.protector, subject, actor=actor)
        await db_session.commit()
        return ErasureResult(
            channel=channel,
            ciphertexts_destroyed=report.ciphertexts_destroyed,
            text_values_scrubbed=report.text_values_scrubbed,
            still_suppressed=report.still_suppressed,
        )


ROUTES: list[Any] = [SubjectsController]
