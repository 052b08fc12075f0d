"""Process start-up shared by `serve`, `worker` and the admin commands."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from gateway import migrate
from gateway.db import start_embedded_postgres
from gateway.devsecrets import with_development_secrets
from gateway.keys import create_key, has_any_key
from gateway.services import Services, build_services
from gateway.settings import Settings

log = logging.getLogger("gateway")


@dataclass(frozen=True)
class Prepared:
    """Settings with secrets resolved, and the database URL to use."""

    settings: Settings
    database_url: str


def prepare(settings: Settings, *, apply_migrations: bool = True) -> Prepared:
    """Resolve the database (embedded when no DATABASE_URL), secrets, and the schema."""
    if settings.embedded_database:
        settings = with_development_secrets(settings)
        database_url = start_embedded_postgres(settings.data_dir)
    else:
        assert settings.database_url is not None
        database_url = settings.database_url
    if apply_migrations:
        migrate.upgrade(database_url)
    return Prepared(settings, database_url)


def adopt(settings: Settings, database_url: str) -> Prepared:
    """A process started by another that already ran `prepare` (a `serve --workers N` child):
    the same secrets (the development ones are read from the data dir, not generated) and the
    database at `database_url`; nothing is started or migrated here."""
    if settings.embedded_database:
        settings = with_development_secrets(settings, warn=False)
    return Prepared(settings, database_url)


def configure_logging(settings: Settings) -> None:
    """Log records to stderr at GATEWAY_LOG_LEVEL (every gateway process)."""
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def services_for(prepared: Prepared) -> Services:
    """The concrete service graph for a prepared process."""
    return build_services(prepared.settings, prepared.database_url)


async def ensure_first_admin_key(services: Services) -> str | None:
    """Create an admin key if none exists yet; returns its secret (to print once) or None."""
    async with services.sessions() as session:
        if await has_any_key(session):
            return None
        _, secret = await create_key(
            session, ["admin", "send", "read", "export"], name="first-start admin"
        )
        await session.commit()
        return secret
