"""Settings are read once from the environment and validated."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from gateway.settings import SettingsError, load_settings, serving_public_url

KEY = Fernet.generate_key().decode()
HASH = base64.urlsafe_b64encode(b"k" * 32).decode()


def test_defaults_with_no_configuration() -> None:
    s = load_settings({})
    assert s.embedded_database and s.redis_url is None
    assert s.email_provider == "sandbox" and s.sms_provider == "sandbox"
    assert s.data_dir == Path(".gateway")
    assert s.max_body_bytes == 1024 * 1024
    assert (
        s.retry.base_seconds == 2.0 and s.retry.max_seconds == 600.0 and s.retry.max_attempts == 6
    )


def test_full_production_configuration() -> None:
    s = load_settings(
        {
            "DATABASE_URL": "postgresql://u:p@db:5432/gw",
            "REDIS_URL": "redis://cache:6379/1",
            "GATEWAY_PUBLIC_URL": "https://hooks.example.com/",
            "GATEWAY_EMAIL_PROVIDER": "ses",
            "AWS_REGION": "eu-west-1",
            "GATEWAY_SMS_PROVIDER": "twilio",
            "GATEWAY_TWILIO_ACCOUNT_SID": "AC123",
            "GATEWAY_TWILIO_AUTH_TOKEN": "new, old",
            "GATEWAY_TWILIO_MESSAGING_SERVICE_SID": "MG1",
            "GATEWAY_TWILIO_SUBACCOUNT_TOKENS": "AC9=t1|t2",
            "GATEWAY_SNS_TOPIC_ARNS": "arn:aws:sns:eu-west-1:1:a,arn:aws:sns:eu-west-1:1:b",
            "GATEWAY_SECRET_KEYS": f"{KEY},{Fernet.generate_key().decode()}",
            "GATEWAY_HASH_KEY": HASH,
            "GATEWAY_RETRY_BASE_SECONDS": "0.05",
        }
    )
    assert s.public_url == "https://hooks.example.com"
    assert s.twilio_auth_tokens == ("new", "old")
    assert s.twilio_subaccount_tokens == {"AC9": ("t1", "t2")}
    assert len(s.sns_topic_arns) == 2 and len(s.secret_keys) == 2
    assert s.hash_key == b"k" * 32
    assert s.retry.base_seconds == 0.05


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"GATEWAY_EMAIL_PROVIDER": "smtp"}, "GATEWAY_EMAIL_PROVIDER"),
        ({"GATEWAY_SMS_PROVIDER": "nexmo"}, "GATEWAY_SMS_PROVIDER"),
        ({"GATEWAY_PUBLIC_URL": "ftp://x"}, "GATEWAY_PUBLIC_URL"),
        ({"REDIS_URL": "memcached://x"}, "REDIS_URL"),
        ({"GATEWAY_HASH_KEY": "c2hvcnQ="}, "GATEWAY_HASH_KEY"),
        ({"GATEWAY_MAX_BODY_BYTES": "-1"}, "GATEWAY_MAX_BODY_BYTES"),
        ({"GATEWAY_RETRY_MAX_ATTEMPTS": "0"}, "GATEWAY_RETRY_MAX_ATTEMPTS"),
        ({"GATEWAY_WORKER_ENABLED": "perhaps"}, "GATEWAY_WORKER_ENABLED"),
        ({"GATEWAY_EMAIL_PROVIDER": "ses"}, "AWS_REGION"),
        ({"DATABASE_URL": "postgresql://db/gw"}, "GATEWAY_SECRET_KEYS"),
        ({"DATABASE_URL": "postgresql://db/gw", "GATEWAY_SECRET_KEYS": KEY}, "GATEWAY_HASH_KEY"),
        ({"GATEWAY_TWILIO_SUBACCOUNT_TOKENS": "nonsense"}, "GATEWAY_TWILIO_SUBACCOUNT_TOKENS"),
    ],
)
def test_invalid_settings_name_the_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert info.value.name == name
    assert str(info.value).startswith(name)


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("127.0.0.1", 8001, "http://127.0.0.1:8001"),
        ("0.0.0.0", 9000, "http://127.0.0.1:9000"),
        ("::1", 8002, "http://[::1]:8002"),
        ("gw.internal", 80, "http://gw.internal:80"),
    ],
)
def test_public_url_follows_serve_host_and_port(host: str, port: int, expected: str) -> None:
    assert serving_public_url(load_settings({}), host, port) == expected


def test_explicit_public_url_wins_over_host_and_port() -> None:
    s = load_settings({"GATEWAY_PUBLIC_URL": "https://hooks.example.com"})
    assert serving_public_url(s, "127.0.0.1", 8001) == "https://hooks.example.com"


def test_third_party_log_level() -> None:
    assert load_settings({}).third_party_log_level == "WARNING"
    s = load_settings({"GATEWAY_THIRD_PARTY_LOG_LEVEL": "INFO", "GATEWAY_LOG_LEVEL": "DEBUG"})
    assert (s.third_party_log_level, s.log_level) == ("INFO", "DEBUG")
    with pytest.raises(SettingsError) as raised:
        load_settings({"GATEWAY_THIRD_PARTY_LOG_LEVEL": "LOUD"})
    assert raised.value.name == "GATEWAY_THIRD_PARTY_LOG_LEVEL"
