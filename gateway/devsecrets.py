"""Development secrets for the embedded default, generated once and kept in the data dir."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet

from gateway.settings import Settings

log = logging.getLogger("gateway")

WARNING = (
    "USING DEVELOPMENT SECRETS from {path}: they are generated for local use only. "
    "Set GATEWAY_SECRET_KEYS and GATEWAY_HASH_KEY for any real deployment."
)


def with_development_secrets(settings: Settings, *, warn: bool = True) -> Settings:
    """Fill in missing secrets from `<data_dir>/dev-secrets.json`, creating it on first use.
    `warn=False` for a process whose parent has already warned (`serve --workers N`)."""
    if settings.secret_keys and settings.hash_key:
        return settings
    path = settings.data_dir / "dev-secrets.json"
    data = _load_or_create(path)
    if warn:
        log.warning(WARNING.format(path=path))
    return dataclasses.replace(
        settings,
        secret_keys=settings.secret_keys or (data["secret_key"],),
        hash_key=settings.hash_key or base64.urlsafe_b64decode(data["hash_key"]),
        development_secrets=True,
    )


def _load_or_create(path: Path) -> dict[str, str]:
    if path.exists():
        loaded: dict[str, str] = json.loads(path.read_text())
        return loaded
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "secret_key": Fernet.generate_key().decode("ascii"),
        "hash_key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii"),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return data
