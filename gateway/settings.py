"""Settings, read once from the environment and validated at start.

Every setting is named after its environment variable. A bad value raises `SettingsError`
naming the variable; the CLI turns that into one line on stderr and exit status 2.
Each package keeps a plain dataclass of its own knobs; this module is the one place that
reads the environment and fills them in.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from cryptography.fernet import Fernet

from gateway.providers import (
    PROVIDERS,
    Registration,
    choices,
    default_rate_limits,
    provider_env,
    send_spec,
)
from retry.settings import UNKNOWN_OUTCOME_POLICIES, parse_policies, parse_rate_limits
from retry.settings import RetrySettings as RetrySettings  # re-exported: gateway.settings API
from sender.classify import parse_overrides
from sender.providers.spec import SettingError
from sender.reputation import ReputationSettings, Thresholds
from webhooks.outbound.settings import OutboundSettings as OutboundSettings  # re-exported
from webhooks.outbound.settings import parse_retry_schedule
from webhooks.settings import WebhookSettings as WebhookSettings  # re-exported
from webhooks.settings import parse_classification_overrides

T = TypeVar("T")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("json", "console")


class SettingsError(ValueError):
    """A setting is missing or invalid; `name` is the environment variable."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem


@dataclass(frozen=True)
class Settings:
    """All gateway settings. `database_url=None` means the embedded PostgreSQL in `data_dir`."""

    database_url: str | None = None
    redis_url: str | None = None
    redis_prefix: str = "gw:"
    data_dir: Path = Path(".gateway")
    public_url: str = "http://127.0.0.1:8000"
    # True when GATEWAY_PUBLIC_URL was not set: `gateway serve` then derives the public URL
    # from its --host/--port (see `serving_public_url`).
    public_url_derived: bool = False
    email_provider: str = "sandbox"
    sms_provider: str = "sandbox"
    email_from: str = "gateway@example.com"
    sms_from: str | None = None
    twilio_messaging_service_sid: str | None = None
    ses_configuration_set: str | None = None
    sns_topic_arns: tuple[str, ...] = ()
    twilio_account_sid: str | None = None
    # Several tokens may be valid at once (rotation); the first one is used to send.
    twilio_auth_tokens: tuple[str, ...] = ()
    # Per-subaccount tokens: AccountSid -> tokens.
    twilio_subaccount_tokens: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    twilio_api_base: str | None = None
    secret_keys: tuple[str, ...] = ()
    hash_key: bytes = b""
    development_secrets: bool = False
    max_body_bytes: int = 1024 * 1024
    # Pooled database connections per process (the pool may grow by half as many again).
    db_pool_size: int = 20
    default_region: str = "US"
    sns_max_age_seconds: float = 3600.0
    # Optional `mailto:` URI added to List-Unsubscribe next to the one-click HTTPS URL.
    unsubscribe_mailto: str | None = None
    log_level: str = "INFO"
    # Level of every other library's loggers (embedded PostgreSQL, twilio, botocore, httpx,
    # alembic, ...): their INFO lines drown the gateway's own at start and per provider call.
    third_party_log_level: str = "WARNING"
    # GATEWAY_LOG_FORMAT: "json" (one object per line) or "console"; None = console when
    # stderr is a terminal, json otherwise.
    log_format: str | None = None
    # GATEWAY_METRICS_DIR: prometheus-client's multiprocess directory, shared by every
    # process of one host (`serve --workers N`, `gateway worker`); None = data_dir/metrics.
    metrics_dir: Path | None = None
    # How long an API-key look-up is reused in a process (0: look every request up); a key
    # revoked by another process stops working here within this time.
    api_key_cache_seconds: float = 5.0
    retry: RetrySettings = field(default_factory=RetrySettings)
    # Feedback path (webhooks package): soft bounces, feedback retry cap, classification.
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    # Outbound webhooks (webhooks.outbound): SSRF rule, retry schedule, timeouts, concurrency.
    outbound: OutboundSettings = field(default_factory=OutboundSettings)
    # Send path (sender package).
    # `<provider>:<code>` -> class, overriding sender.classify's table.
    send_error_overrides: Mapping[str, str] = field(default_factory=dict)
    # Deliveries of one request sent at the same time.
    send_concurrency: int = 16
    # GATEWAY_MARKETING_ASYNC: accept `category: marketing` sends asynchronously by default
    # (202, deliveries queued for the workers) as if they asked `Prefer: respond-async`.
    # Off by default: it changes the answer existing clients get (202 with `queued` instead
    # of 201 with the provider's first answer).
    marketing_async: bool = False
    provider_connect_timeout_seconds: float = 5.0
    provider_read_timeout_seconds: float = 15.0
    # botocore's own attempts per SendEmail (1 = no botocore retry; see sender/providers/ses).
    ses_max_attempts: int = 1
    # How long after a sandbox send its simulated callbacks arrive (per event).
    sandbox_feedback_delay_seconds: float = 0.2
    # AWS_REGION (or AWS_DEFAULT_REGION): the SES region.
    aws_region: str | None = None
    # Campaigns (sender.campaigns): recipients expanded into deliveries per transaction, and
    # how often an idle expansion job looks for work.
    campaign_batch: int = 5000
    campaign_poll_seconds: float = 1.0
    # The reputation guard (GATEWAY_REPUTATION_*, sender.reputation).
    reputation: ReputationSettings = field(default_factory=ReputationSettings)
    # GATEWAY_STALE_REPORT_HOURS: how long a delivery may wait for its final callback (and a
    # parked event for its delivery) before the stale report lists it.
    stale_report_hours: float = 72.0
    # The settings registered providers declare (`SendSpec.settings`), as set: a provider
    # added in gateway/providers.py reads its own from here (`ProviderContext.env`).
    provider_env: Mapping[str, str] = field(default_factory=dict)
    # Outbound events (sender.events): how long event rows are kept (the feed's cursors stay
    # valid this long); the worker's sweep prunes older ones.
    event_retention_days: int = 30

    @property
    def embedded_database(self) -> bool:
        """True when no DATABASE_URL is set and the embedded PostgreSQL is used."""
        return self.database_url is None


def _str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _str(env, name) or default
    if value not in choices:
        raise SettingsError(name, f"must be one of {', '.join(choices)} (got {value!r})")
    return value


def _number(env: Mapping[str, str], name: str, default: T, kind: type[T], minimum: float) -> T:
    raw = _str(env, name)
    if raw is None:
        return default
    try:
        value = kind(raw)  # type: ignore[call-arg]
    except ValueError:
        raise SettingsError(name, f"must be a {kind.__name__} (got {raw!r})") from None
    if value < minimum:  # type: ignore[operator]
        raise SettingsError(name, f"must be at least {minimum} (got {raw!r})")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _str(env, name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SettingsError(name, f"must be true or false (got {raw!r})")


def _list(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = _str(env, name) or ""
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _url(env: Mapping[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    value = _str(env, name)
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in schemes or not (parts.netloc or parts.path):
        raise SettingsError(name, f"must be a URL with scheme {' or '.join(schemes)}")
    return value


def _fernet_keys(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    keys = _list(env, name)
    for key in keys:
        try:
            Fernet(key)
        except (ValueError, binascii.Error):
            raise SettingsError(
                name, "each key must be a urlsafe-base64 32-byte Fernet key"
            ) from None
    return keys


def _hash_key(env: Mapping[str, str], name: str) -> bytes:
    raw = _str(env, name)
    if raw is None:
        return b""
    try:
        key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (ValueError, binascii.Error):
        raise SettingsError(name, "must be urlsafe base64 of at least 32 bytes") from None
    if len(key) < 32:
        raise SettingsError(name, "must be urlsafe base64 of at least 32 bytes")
    return key


def _subaccount_tokens(env: Mapping[str, str], name: str) -> dict[str, tuple[str, ...]]:
    # Format: "ACxxx=token1|token2,ACyyy=token3"
    result: dict[str, tuple[str, ...]] = {}
    for item in _list(env, name):
        sid, sep, tokens = item.partition("=")
        if not sep or not sid.startswith("AC") or not tokens:
            raise SettingsError(name, "must look like ACsid=token1|token2,ACsid2=token3")
        result[sid] = tuple(t for t in tokens.split("|") if t)
    return result


def _retry(env: Mapping[str, str], providers: Sequence[Registration]) -> RetrySettings:
    d = RetrySettings()
    return RetrySettings(
        base_seconds=_number(env, "GATEWAY_RETRY_BASE_SECONDS", d.base_seconds, float, 0.0),
        max_seconds=_number(env, "GATEWAY_RETRY_MAX_SECONDS", d.max_seconds, float, 0.0),
        max_attempts=_number(env, "GATEWAY_RETRY_MAX_ATTEMPTS", d.max_attempts, int, 1),
        feedback_base_seconds=_number(
            env, "GATEWAY_RETRY_FEEDBACK_BASE_SECONDS", d.feedback_base_seconds, float, 0.0
        ),
        worker_enabled=_bool(env, "GATEWAY_WORKER_ENABLED", d.worker_enabled),
        worker_poll_seconds=_number(
            env, "GATEWAY_WORKER_POLL_SECONDS", d.worker_poll_seconds, float, 0.01
        ),
        worker_batch=_number(env, "GATEWAY_WORKER_BATCH", d.worker_batch, int, 1),
        unknown_settle_seconds=_number(
            env, "GATEWAY_UNKNOWN_SETTLE_SECONDS", d.unknown_settle_seconds, float, 0.0
        ),
        stale_in_progress_seconds=_number(
            env, "GATEWAY_STALE_IN_PROGRESS_SECONDS", d.stale_in_progress_seconds, float, 0.0
        ),
        policies=_parsed(env, "GATEWAY_RETRY_POLICIES", parse_policies, d.policies),
        worker_concurrency=_number(env, "GATEWAY_WORKER_CONCURRENCY", d.worker_concurrency, int, 1),
        unknown_outcome_marketing=_choice(
            env,
            "GATEWAY_UNKNOWN_OUTCOME_MARKETING",
            d.unknown_outcome_marketing,
            UNKNOWN_OUTCOME_POLICIES,
        ),
        # Default buckets come from the registered providers (gateway/providers.py).
        rate_limits=_parsed(
            env, "GATEWAY_RATE_LIMITS", parse_rate_limits, default_rate_limits(providers)
        ),
        low_priority_share=_share(env, "GATEWAY_RATE_LOW_SHARE", d.low_priority_share),
        normal_priority_share=_share(env, "GATEWAY_RATE_NORMAL_SHARE", d.normal_priority_share),
        defer_seconds=_number(env, "GATEWAY_RETRY_DEFER_SECONDS", d.defer_seconds, float, 0.0),
        max_deferral_seconds=_number(
            env, "GATEWAY_RETRY_MAX_DEFERRAL_SECONDS", d.max_deferral_seconds, float, 1.0
        ),
        breaker_failure_ratio=_share(env, "GATEWAY_BREAKER_FAILURE_RATIO", d.breaker_failure_ratio),
        breaker_min_volume=_number(env, "GATEWAY_BREAKER_MIN_VOLUME", d.breaker_min_volume, int, 1),
        breaker_window_seconds=_number(
            env, "GATEWAY_BREAKER_WINDOW_SECONDS", d.breaker_window_seconds, float, 0.01
        ),
        breaker_cooldown_seconds=_number(
            env, "GATEWAY_BREAKER_COOLDOWN_SECONDS", d.breaker_cooldown_seconds, float, 0.0
        ),
        breaker_account_cooldown_seconds=_number(
            env,
            "GATEWAY_BREAKER_ACCOUNT_COOLDOWN_SECONDS",
            d.breaker_account_cooldown_seconds,
            float,
            0.0,
        ),
    )


def _mailto(env: Mapping[str, str], name: str) -> str | None:
    # A bare address is accepted and stored as the full URI the header needs.
    value = _str(env, name)
    if value is None:
        return None
    uri = value if value.lower().startswith("mailto:") else f"mailto:{value}"
    address = uri[len("mailto:") :].split("?", 1)[0]
    if "@" not in address or any(c in uri for c in " <>\r\n"):
        raise SettingsError(name, "must be an email address or a mailto: URI")
    return uri


def _webhooks(env: Mapping[str, str]) -> WebhookSettings:
    d = WebhookSettings()
    return WebhookSettings(
        soft_bounce_threshold=_number(
            env, "GATEWAY_SOFT_BOUNCE_THRESHOLD", d.soft_bounce_threshold, int, 1
        ),
        soft_bounce_window_seconds=_number(
            env, "GATEWAY_SOFT_BOUNCE_WINDOW_SECONDS", d.soft_bounce_window_seconds, float, 1.0
        ),
        soft_bounce_suppression_seconds=_number(
            env,
            "GATEWAY_SOFT_BOUNCE_SUPPRESSION_SECONDS",
            d.soft_bounce_suppression_seconds,
            float,
            1.0,
        ),
        feedback_retry_max_seconds=_number(
            env, "GATEWAY_FEEDBACK_RETRY_MAX_SECONDS", d.feedback_retry_max_seconds, float, 0.0
        ),
        classification_overrides=_parsed(
            env,
            "GATEWAY_FEEDBACK_CLASSIFICATION_OVERRIDES",
            parse_classification_overrides,
            d.classification_overrides,
        ),
    )


def _percent(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, default, float, 0.0)
    if not 0.0 < value <= 100.0:
        raise SettingsError(name, f"must be a percentage in (0, 100] (got {value!r})")
    return value


def _thresholds(
    env: Mapping[str, str], prefix: str, first: str, second: str, d: Thresholds
) -> Thresholds:
    names = (
        f"{prefix}_{first}_PERCENT",
        f"{prefix}_{second}_PERCENT",
        f"{prefix}_{first}_PAUSE_ALL_PERCENT",
        f"{prefix}_{second}_PAUSE_ALL_PERCENT",
    )
    t = Thresholds(
        _percent(env, names[0], d.first_marketing),
        _percent(env, names[1], d.second_marketing),
        _percent(env, names[2], d.first_all),
        _percent(env, names[3], d.second_all),
    )
    if t.first_all < t.first_marketing:
        raise SettingsError(names[2], f"must be at least {names[0]} ({t.first_marketing})")
    if t.second_all < t.second_marketing:
        raise SettingsError(names[3], f"must be at least {names[1]} ({t.second_marketing})")
    return t


def _reputation(env: Mapping[str, str]) -> ReputationSettings:
    d = ReputationSettings()
    p = "GATEWAY_REPUTATION"
    return ReputationSettings(
        enabled=_bool(env, f"{p}_ENABLED", d.enabled),
        window_hours=_number(env, f"{p}_WINDOW_HOURS", d.window_hours, float, 0.01),
        min_sends=_number(env, f"{p}_MIN_SENDS", d.min_sends, int, 1),
        email=_thresholds(env, p, "BOUNCE", "COMPLAINT", d.email),
        sms=_thresholds(env, f"{p}_SMS", "FAILURE", "OPT_OUT", d.sms),
        evaluate_seconds=_number(env, f"{p}_EVALUATE_SECONDS", d.evaluate_seconds, float, 1.0),
        refresh_seconds=_number(env, f"{p}_REFRESH_SECONDS", d.refresh_seconds, float, 0.1),
        resume_hours=_number(env, f"{p}_RESUME_HOURS", d.resume_hours, float, 0.01),
    )


def _outbound(env: Mapping[str, str], *, embedded: bool) -> OutboundSettings:
    d = OutboundSettings()
    ca_bundle = _str(env, "GATEWAY_WEBHOOK_CA_BUNDLE")
    if ca_bundle is not None and not Path(ca_bundle).is_file():
        raise SettingsError("GATEWAY_WEBHOOK_CA_BUNDLE", f"no such file: {ca_bundle}")
    return OutboundSettings(
        # The embedded default (no DATABASE_URL: a development sandbox) may push to local
        # receivers; a deployment must say so explicitly.
        allow_private=_bool(env, "GATEWAY_WEBHOOK_ALLOW_PRIVATE", embedded),
        retry_schedule=_parsed(
            env, "GATEWAY_WEBHOOK_RETRY_SCHEDULE", parse_retry_schedule, d.retry_schedule
        ),
        disable_after_seconds=_number(
            env, "GATEWAY_WEBHOOK_DISABLE_AFTER_SECONDS", d.disable_after_seconds, float, 1.0
        ),
        connect_timeout_seconds=_number(
            env, "GATEWAY_WEBHOOK_CONNECT_TIMEOUT_SECONDS", d.connect_timeout_seconds, float, 0.1
        ),
        read_timeout_seconds=_number(
            env, "GATEWAY_WEBHOOK_READ_TIMEOUT_SECONDS", d.read_timeout_seconds, float, 0.1
        ),
        concurrency=_number(env, "GATEWAY_WEBHOOK_CONCURRENCY", d.concurrency, int, 1),
        endpoint_concurrency=_number(
            env, "GATEWAY_WEBHOOK_ENDPOINT_CONCURRENCY", d.endpoint_concurrency, int, 1
        ),
        poll_seconds=_number(env, "GATEWAY_WEBHOOK_POLL_SECONDS", d.poll_seconds, float, 0.01),
        fanout_batch=_number(env, "GATEWAY_WEBHOOK_FANOUT_BATCH", d.fanout_batch, int, 1),
        ca_bundle=ca_bundle,
    )


def _parsed(env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    raw = _str(env, name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise SettingsError(name, str(exc)) from None


def _share(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, default, float, 0.0)
    if not 0.0 < value <= 1.0:
        raise SettingsError(name, f"must be a fraction in (0, 1] (got {value!r})")
    return value


def serving_public_url(settings: Settings, host: str, port: int) -> str:
    """The public base URL a server on `host:port` builds its links with: GATEWAY_PUBLIC_URL
    when set, else `http://<host>:<port>` (a wildcard address becomes 127.0.0.1, the address
    a local client reaches it on)."""
    if not settings.public_url_derived:
        return settings.public_url
    if host in ("", "0.0.0.0", "::", "[::]"):  # noqa: S104 (a comparison, not a bind)
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal in a URL
    return f"http://{host}:{port}"


def load_settings(
    env: Mapping[str, str] | None = None, *, providers: Sequence[Registration] = PROVIDERS
) -> Settings:
    """Read and validate every setting from `env` (default: the process environment), for
    the registered `providers` (gateway/providers.py)."""
    env = os.environ if env is None else env
    email = (*choices("email", providers), "sandbox")
    email_provider = _choice(env, "GATEWAY_EMAIL_PROVIDER", "sandbox", email)
    sms_provider = _choice(
        env, "GATEWAY_SMS_PROVIDER", "sandbox", (*choices("sms", providers), "sandbox")
    )
    settings = Settings(
        database_url=_url(env, "DATABASE_URL", ("postgresql", "postgres", "postgresql+asyncpg")),
        redis_url=_url(env, "REDIS_URL", ("redis", "rediss", "unix")),
        redis_prefix=_str(env, "GATEWAY_REDIS_PREFIX") or "gw:",
        data_dir=Path(_str(env, "GATEWAY_DATA_DIR") or ".gateway"),
        public_url=(
            _url(env, "GATEWAY_PUBLIC_URL", ("http", "https")) or "http://127.0.0.1:8000"
        ).rstrip("/"),
        public_url_derived=_str(env, "GATEWAY_PUBLIC_URL") is None,
        email_provider=email_provider,
        sms_provider=sms_provider,
        email_from=_str(env, "GATEWAY_EMAIL_FROM") or "gateway@example.com",
        sms_from=_str(env, "GATEWAY_SMS_FROM"),
        twilio_messaging_service_sid=_str(env, "GATEWAY_TWILIO_MESSAGING_SERVICE_SID"),
        ses_configuration_set=_str(env, "GATEWAY_SES_CONFIGURATION_SET"),
        sns_topic_arns=_list(env, "GATEWAY_SNS_TOPIC_ARNS"),
        twilio_account_sid=_str(env, "GATEWAY_TWILIO_ACCOUNT_SID"),
        twilio_auth_tokens=_list(env, "GATEWAY_TWILIO_AUTH_TOKEN"),
        twilio_subaccount_tokens=_subaccount_tokens(env, "GATEWAY_TWILIO_SUBACCOUNT_TOKENS"),
        twilio_api_base=_url(env, "GATEWAY_TWILIO_API_BASE", ("http", "https")),
        secret_keys=_fernet_keys(env, "GATEWAY_SECRET_KEYS"),
        hash_key=_hash_key(env, "GATEWAY_HASH_KEY"),
        max_body_bytes=_number(env, "GATEWAY_MAX_BODY_BYTES", 1024 * 1024, int, 1024),
        db_pool_size=_number(env, "GATEWAY_DB_POOL_SIZE", 20, int, 1),
        default_region=(_str(env, "GATEWAY_DEFAULT_REGION") or "US").upper(),
        sns_max_age_seconds=_number(env, "GATEWAY_SNS_MAX_AGE_SECONDS", 3600.0, float, 1.0),
        unsubscribe_mailto=_mailto(env, "GATEWAY_UNSUBSCRIBE_MAILTO"),
        log_level=_choice(env, "GATEWAY_LOG_LEVEL", "INFO", LOG_LEVELS),
        third_party_log_level=_choice(env, "GATEWAY_THIRD_PARTY_LOG_LEVEL", "WARNING", LOG_LEVELS),
        log_format=(
            _choice(env, "GATEWAY_LOG_FORMAT", "json", LOG_FORMATS)
            if _str(env, "GATEWAY_LOG_FORMAT")
            else None
        ),
        metrics_dir=Path(d) if (d := _str(env, "GATEWAY_METRICS_DIR")) else None,
        api_key_cache_seconds=_number(env, "GATEWAY_API_KEY_CACHE_SECONDS", 5.0, float, 0.0),
        retry=_retry(env, providers),
        webhooks=_webhooks(env),
        outbound=_outbound(env, embedded=_str(env, "DATABASE_URL") is None),
        send_error_overrides=_parsed(env, "GATEWAY_SEND_ERROR_OVERRIDES", parse_overrides, {}),
        send_concurrency=_number(env, "GATEWAY_SEND_CONCURRENCY", 16, int, 1),
        marketing_async=_bool(env, "GATEWAY_MARKETING_ASYNC", False),
        provider_connect_timeout_seconds=_number(
            env, "GATEWAY_PROVIDER_CONNECT_TIMEOUT_SECONDS", 5.0, float, 0.1
        ),
        provider_read_timeout_seconds=_number(
            env, "GATEWAY_PROVIDER_READ_TIMEOUT_SECONDS", 15.0, float, 0.1
        ),
        ses_max_attempts=_number(env, "GATEWAY_SES_MAX_ATTEMPTS", 1, int, 1),
        sandbox_feedback_delay_seconds=_number(
            env, "GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS", 0.2, float, 0.0
        ),
        aws_region=_str(env, "AWS_REGION") or _str(env, "AWS_DEFAULT_REGION"),
        campaign_batch=_number(env, "GATEWAY_CAMPAIGN_BATCH", 5000, int, 1),
        campaign_poll_seconds=_number(env, "GATEWAY_CAMPAIGN_POLL_SECONDS", 1.0, float, 0.01),
        reputation=_reputation(env),
        stale_report_hours=_number(env, "GATEWAY_STALE_REPORT_HOURS", 72.0, float, 0.01),
        provider_env=provider_env(env, providers),
        event_retention_days=_number(env, "GATEWAY_EVENT_RETENTION_DAYS", 30, int, 1),
    )
    _check_consistency(settings, env, providers)
    return settings


def _check_consistency(
    s: Settings, env: Mapping[str, str], providers: Sequence[Registration]
) -> None:
    for channel, name in (("email", s.email_provider), ("sms", s.sms_provider)):
        spec = send_spec(name, channel, providers)
        if spec is not None and spec.check is not None:
            try:
                spec.check(s.provider_env)
            except SettingError as exc:
                raise SettingsError(exc.name, exc.problem) from None
    if s.email_provider == "ses" and not (
        _str(env, "AWS_REGION") or _str(env, "AWS_DEFAULT_REGION")
    ):
        # boto3 cannot pick an endpoint without a region; say so at start, not at first send.
        raise SettingsError("AWS_REGION", "is required when GATEWAY_EMAIL_PROVIDER=ses")
    if s.sms_provider == "twilio":
        if not s.twilio_account_sid:
            raise SettingsError(
                "GATEWAY_TWILIO_ACCOUNT_SID", "is required when GATEWAY_SMS_PROVIDER=twilio"
            )
        if not s.twilio_auth_tokens:
            raise SettingsError(
                "GATEWAY_TWILIO_AUTH_TOKEN", "is required when GATEWAY_SMS_PROVIDER=twilio"
            )
        if not (s.sms_from or s.twilio_messaging_service_sid):
            raise SettingsError(
                "GATEWAY_SMS_FROM",
                "(or GATEWAY_TWILIO_MESSAGING_SERVICE_SID) is required"
                " when GATEWAY_SMS_PROVIDER=twilio",
            )
    if not s.embedded_database and (not s.secret_keys or not s.hash_key):
        # Development secrets are generated only for the embedded default; a real deployment
        # must bring its own so that several processes share them.
        missing = "GATEWAY_SECRET_KEYS" if not s.secret_keys else "GATEWAY_HASH_KEY"
        raise SettingsError(missing, "is required when DATABASE_URL is set")
