"""The bulk and hot paths on plain SQL: asyncpg callers, large checks, imports and exports."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator

from sqlalchemy import func, select, text

from gateway.services import Services
from suppression import service
from suppression.db import pg_connection
from suppression.exporter import export_chunks
from suppression.formats import ImportOptions
from suppression.importer import run_import
from suppression.models import Suppression, SuppressionHistory
from suppression.normalize import normalize_email


async def test_service_calls_take_an_asyncpg_connection(services: Services) -> None:
    p = services.protector
    addr = normalize_email("Conn@Example.com")
    h = p.hash("email", addr.key)
    async with pg_connection(services.engine) as conn:
        entry, created = await service.add(
            conn, p, addr, reason="hard_bounce", source=service.Source("provider_event", "e1")
        )
        assert created and entry.reason == "hard_bounce" and entry.evidence == {}
        again, created = await service.add(
            conn, p, addr, reason="complaint", source=service.Source("provider_event", "e2")
        )
        assert not created and again.id == entry.id and again.reason == "complaint"
        hit = await service.check(conn, "email", h)
        assert hit is not None and hit.reason == "complaint"
        assert set(await service.check_many(conn, "email", [h, "0" * 64])) == {h}
        assert await service.erased_hashes(conn, [("email", h)]) == set()
        removed = await service.remove(
            conn, "email", h, reason="test", source=service.Source("operator", actor="op")
        )
        assert [r.id for r in removed] == [entry.id]
        assert await service.check(conn, "email", h) is None
    async with services.sessions() as s:
        actions = (await s.execute(select(SuppressionHistory.action))).scalars().all()
    assert sorted(actions) == ["add", "remove", "upgrade"]


async def test_check_many_of_10000_hashes_against_many_entries(services: Services) -> None:
    async with services.sessions() as s:
        # 20,000 entries: even numbers channel-wide, multiples of 3 also a topic entry.
        await s.execute(
            text(
                "INSERT INTO suppressions (id, channel, address_hash, scope, reason,"
                " source_type, evidence, created_at)"
                " SELECT gen_random_uuid(), 'email', 'h' || i, sc, 'manual', 'operator',"
                " '{}'::jsonb, now()"
                " FROM generate_series(0, 39999, 2) AS i, LATERAL (VALUES ('all'), ('news')) v(sc)"
                " WHERE sc = 'all' OR i % 3 = 0"
            )
        )
        await s.commit()
        hashes = [f"h{i}" for i in range(10_000)]
        hits = await service.check_many(s, "email", hashes, topic="news")
        assert set(hits) == {f"h{i}" for i in range(0, 10_000, 2)}
        assert {hit.scope for hit in hits.values()} == {"all"}
        hits = await service.check_many(s, "email", hashes, category="transactional")
        assert len(hits) == 5000


async def _body(lines: list[str]) -> AsyncIterator[bytes]:
    data = "".join(lines).encode()
    for start in range(0, len(data), 7919):  # chunk edges fall inside lines
        yield data[start : start + 7919]


async def test_large_import_with_duplicates_and_invalid_rows_reports_exactly(
    services: Services,
) -> None:
    lines = ["channel,address,reason,scope\n"]
    expected_invalid = []
    for i in range(6000):
        if i % 500 == 7:
            lines.append("email,not-an-address,manual,all\n")
            expected_invalid.append(len(lines))
        lines.append(f"email,user{i}@example.com,hard_bounce,all\n")
        if i % 100 == 0:  # a repeat in the same batch, and one far away (another batch)
            lines.append(f"email,USER{i}@example.com,hard_bounce,all\n")
        if i % 1000 == 1:
            lines.append(f"email,user{i}@example.com,complaint,all\n")  # upgrades
    lines.append("email,user5@example.com,manual,all\n")  # a repeat in the last batch
    report = await run_import(
        services.sessions,
        services.protector,
        _body(lines),
        ImportOptions(),
        actor="test",
        batch_size=1000,
    )
    data_rows = len(lines) - 1 - len(expected_invalid)
    assert report.added == 6000
    assert report.already_present == data_rows - 6000
    assert report.invalid_count == len(expected_invalid)
    assert [row["line"] for row in report.invalid] == expected_invalid
    async with services.sessions() as s:
        count = (await s.execute(select(func.count()).select_from(Suppression))).scalar_one()
        complaints = (
            await s.execute(
                select(func.count())
                .select_from(Suppression)
                .where(Suppression.reason == "complaint")
            )
        ).scalar_one()
        actions = dict(
            (
                await s.execute(
                    select(SuppressionHistory.action, func.count()).group_by(
                        SuppressionHistory.action
                    )
                )
            ).all()
        )
    assert count == 6000 and complaints == 6
    # each complaint follows its bounce in the same batch: one add of the complaint
    assert actions == {"add": 6000}


async def test_export_streams_every_row_once(services: Services) -> None:
    count = 2500
    async with services.sessions() as s:
        # Many entries share a creation time: the order (created_at, id) still holds.
        await s.execute(
            text(
                "INSERT INTO suppressions (id, channel, address_hash, address_encrypted, scope,"
                " reason, source_type, evidence, created_at)"
                " SELECT gen_random_uuid(), 'email', 'h' || i, :c, 'all', 'manual', 'operator',"
                " '{}'::jsonb, timestamptz '2024-01-01' + (i / 100) * interval '1 second'"
                " FROM generate_series(1, :n) AS i"
            ),
            {"c": services.protector.encrypt("x@example.com"), "n": count},
        )
        await s.commit()
    batches: list[int] = []
    body = b"".join(
        [
            chunk
            async for chunk in export_chunks(
                services.sessions,
                services.protector,
                fmt="csv",
                batch_size=300,
                on_batch=batches.append,
            )
        ]
    )
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert len(rows) == count and len({r["id"] for r in rows}) == count
    assert sum(batches) == count and max(batches) == 300
    assert {r["address"] for r in rows} == {"x@example.com"}
    assert [r["created_at"] for r in rows] == sorted(r["created_at"] for r in rows)
