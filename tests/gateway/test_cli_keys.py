"""`gateway keys create|list|revoke` against a real database."""

from __future__ import annotations

import subprocess

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.conftest import gateway_env
from tests.support.process import GATEWAY


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GATEWAY, *args], env=env, capture_output=True, text=True, timeout=60)


def test_keys_create_list_revoke(clean_database: str) -> None:
    import os

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        **gateway_env(clean_database),
    }
    created = _run(env, "keys", "create", "--scopes", "send,read", "--name", "orders")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert created.stdout == secret + "\n"  # the secret alone on stdout
    assert secret.startswith("gw_")

    engine = create_engine(make_url(clean_database).set(drivername="postgresql+psycopg"))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT secret_hash, scopes FROM api_keys")).all()
    engine.dispose()
    assert len(rows) == 1 and rows[0][1] == ["send", "read"]
    assert secret not in rows[0][0]

    listed = _run(env, "keys", "list")
    assert listed.returncode == 0
    key_id, state, scopes = listed.stdout.split("\t")[:3]
    assert state == "active" and scopes == "send,read"
    assert secret not in listed.stdout

    assert _run(env, "keys", "revoke", key_id).returncode == 0
    assert "\trevoked\t" in _run(env, "keys", "list").stdout
    assert _run(env, "keys", "revoke", key_id).returncode == 1
    bad = _run(env, "keys", "create", "--scopes", "root")
    assert bad.returncode == 2 and "root" in bad.stderr


def test_keys_create_refuses_a_name_the_api_would_refuse(clean_database: str) -> None:
    import os

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        **gateway_env(clean_database),
    }
    for name, why in (("x" * 201, "at most 200 characters"), ("a\nb", "control characters")):
        refused = _run(env, "keys", "create", "--scopes", "send", "--name", name)
        assert refused.returncode == 2, refused.stderr
        assert why in refused.stderr
        assert refused.stdout == ""  # no secret was made
    engine = create_engine(make_url(clean_database).set(drivername="postgresql+psycopg"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM api_keys")).scalar_one() == 0
    engine.dispose()
