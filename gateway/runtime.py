"""Process start-up shared by `serve`, `worker` and the admin commands."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from gateway.devsecrets import with_development_secrets
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.services import Services

# The service graph (providers, Redis, Litestar, boto3, twilio) and Alembic are imported where
# they are used: `gateway keys list` needs neither the providers nor the web framework.

log = logging.getLogger("gateway")


@dataclass(frozen=True)
class Prepared:
    """Settings with secrets resolved, and the database URL to use."""

    settings: Settings
    database_url: str


def prepare(settings: Settings, *, apply_migrations: bool = True) -> Prepared:
    """Resolve the database (embedded when no DATABASE_URL), secrets, and the schema."""
    if settings.embedded_database:
        from gateway.db import start_embedded_postgres

        settings = with_development_secrets(settings)
        database_url = start_embedded_postgres(settings.data_dir)
    else:
        assert settings.database_url is not None
        database_url = settings.database_url
    if apply_migrations:
        from gateway import migrate

        migrate.upgrade(database_url)
    return Prepared(settings, database_url)


def adopt(settings: Settings, database_url: str) -> Prepared:
    """A process started by another that already ran `prepare` (a `serve --workers N` child):
    the same secrets (the development ones are read from the data dir, not generated) and the
    database at `database_url`; nothing is started or migrated here."""
    if settings.embedded_database:
        settings = with_development_secrets(settings, warn=False)
    return Prepared(settings, database_url)


# The gateway's own loggers (and the server's, whose start line says where it listens):
# GATEWAY_LOG_LEVEL. Every other logger inherits the root's GATEWAY_THIRD_PARTY_LOG_LEVEL.
OWN_LOGGERS = ("gateway", "retry", "uvicorn")


def configure_logging(settings: Settings) -> None:
    """Log records to stderr (every gateway process), one JSON object per line or a console
    rendering (GATEWAY_LOG_FORMAT, see `gateway.logs`): the gateway's own at
    GATEWAY_LOG_LEVEL, every library's (embedded PostgreSQL, twilio, botocore, httpx,
    alembic, ...) at GATEWAY_THIRD_PARTY_LOG_LEVEL."""
    from gateway.logs import configure

    configure(settings)
    logging.getLogger().setLevel(settings.third_party_log_level)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(settings.log_level)
    # platformdirs (through the embedded PostgreSQL) warns about a missing XDG_RUNTIME_DIR
    # on servers and in containers; it falls back to a usable directory by itself.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR", category=Warning)


def services_for(prepared: Prepared) -> Services:
    """The concrete service graph for a prepared process."""
    from gateway.services import build_services

    return build_services(prepared.settings, prepared.database_url)


def without_password(url: str) -> str:
    """`url` with its password (if any) replaced by `***`: fit for a log line."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = f"{parts.username or ''}:***"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{netloc[-1]}"))


def startup_summary(prepared: Prepared, *, listen: str | None = None) -> list[str]:
    """A few lines saying where the gateway listens, its database (without password),
    providers, Redis and data directory: what an operator checks first."""
    settings = prepared.settings
    lines = []
    if listen is not None:
        lines.append(f"listening on {listen} (public URL {settings.public_url})")
    database = without_password(prepared.database_url)
    if settings.embedded_database:
        database = f"embedded PostgreSQL in {(settings.data_dir / 'pg').resolve()} ({database})"
    lines.append(f"database: {database}")
    redis = without_password(settings.redis_url) if settings.redis_url else None
    lines.append(
        f"providers: email={settings.email_provider}, sms={settings.sms_provider}; "
        f"rate limits and breaker: {'Redis ' + str(redis) if redis else 'in-process'}"
    )
    lines.append(f"data directory: {settings.data_dir.resolve()}")
    return lines


async def ensure_first_admin_key(services: Services) -> str | None:
    """Create an admin key if none exists yet; returns its secret (to print once) or None."""
    from gateway.keys import create_key, has_any_key

    async with services.sessions() as session:
        if await has_any_key(session):
            return None
        _, secret = await create_key(
            session, ["admin", "send", "read", "export"], name="first-start admin"
        )
        await session.commit()
        return secret
