"""`gateway webhooks list|create|disable|enable|rotate|test|replay` against a real database
and a local HTTPS receiver."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.services import Services
from gateway.settings import Settings
from tests.conftest import gateway_env
from tests.support.process import GATEWAY, clean_env
from tests.webhooks.outbound.receiver import Receiver

MakeKey = Callable[..., Awaitable[str]]


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [GATEWAY, *args], env=env, capture_output=True, text=True, timeout=120
    )


async def test_webhooks_commands(
    settings: Settings,
    services: Services,
    make_key: MakeKey,
    receiver: Receiver,
    tls_files: tuple[Path, Path, Path],
) -> None:
    assert settings.database_url is not None
    env = clean_env(
        **gateway_env(
            settings.database_url,
            GATEWAY_WEBHOOK_CA_BUNDLE=str(tls_files[0]),
            GATEWAY_WEBHOOK_ALLOW_PRIVATE="true",
        )
    )
    principal = await services.api_keys.principal(await make_key("send", "read"))
    assert principal is not None

    created = await _run(
        env,
        "webhooks",
        "create",
        "--url",
        receiver.url(),
        "--events",
        "delivery.bounced,suppression.added",
        "--description",
        "crm",
        "--api-key-id",
        str(principal.key_id),
    )
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert created.stdout == secret + "\n" and secret.startswith("whsec_")
    receiver.secrets.append(secret)

    listed = await _run(env, "webhooks", "list")
    endpoint_id, state, events, url, description = listed.stdout.rstrip("\n").split("\t")
    assert state == "enabled" and url == receiver.url() and description == "crm"
    assert events == "delivery.bounced,suppression.added"
    assert secret not in listed.stdout

    tested = await _run(env, "webhooks", "test", endpoint_id)
    assert tested.returncode == 0, tested.stderr
    assert json.loads(tested.stdout)["delivered"] is True
    (ping,) = receiver.requests
    assert ping.verified_by == [secret] and ping.event["type"] == "ping"

    rotated = await _run(env, "webhooks", "rotate", endpoint_id)
    assert rotated.returncode == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert new.startswith("whsec_") and new != secret
    receiver.secrets.append(new)
    receiver.default_status = 500
    failed = await _run(env, "webhooks", "test", endpoint_id)
    assert failed.returncode == 1 and "HTTP 500" in failed.stderr
    assert set(receiver.requests[1].verified_by) == {secret, new}

    assert (await _run(env, "webhooks", "disable", endpoint_id)).returncode == 0
    as_json = json.loads((await _run(env, "webhooks", "list", "--json")).stdout)
    assert as_json["enabled"] is False and as_json["disabled_reason"] == "operator"
    assert (await _run(env, "webhooks", "enable", endpoint_id)).returncode == 0
    shown = await services.webhook_endpoints.get(uuid.UUID(as_json["id"]))
    assert shown.enabled

    replayed = await _run(
        env, "webhooks", "replay", endpoint_id, "--since", "2020-01-01T00:00:00+00:00"
    )
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout) == {"replayed": 0, "next_since": None}

    refused = await _run(
        clean_env(**gateway_env(settings.database_url)),  # production rules
        "webhooks",
        "create",
        "--url",
        "https://169.254.169.254/latest",
        "--api-key-id",
        str(principal.key_id),
    )
    assert refused.returncode == 2 and "169.254.169.254" in refused.stderr
    missing = await _run(env, "webhooks", "disable", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "no endpoint" in missing.stderr
