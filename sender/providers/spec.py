"""What a send-side provider declares: one `SendSpec` per provider, registered by `gateway`.

A spec is light (no SDK import): its name and channel, its error table (`ErrorTable`, which
the feedback side classifies callbacks with too), its default rate-limit buckets, the names
of the environment settings it reads, and `build`, which makes the adapter (and may import
the SDK then). The composition root (`gateway/providers.py`) lists the specs; nothing else in
`sender` names a provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from retry.settings import RateSpec
from sender.providers.base import Provider
from sender.providers.codes import ErrorTable


@dataclass(frozen=True)
class ProviderContext:
    """What `SendSpec.build` gets from the composition root.

    `settings` is the gateway's `Settings` (the built-in providers read their historical
    fields from it); `env` holds the values of the names the spec lists in `settings`
    (absent names are missing), read once at start like every other setting.
    """

    settings: Any
    env: Mapping[str, str]
    public_url: str
    connect_timeout: float
    read_timeout: float


@dataclass(frozen=True)
class SendSpec:
    """One provider's send side (see the module docstring)."""

    name: str
    channel: str
    build: Callable[[ProviderContext], Provider]
    errors: ErrorTable | None = None
    # Rate-limit bucket -> default rate (used while GATEWAY_RATE_LIMITS is not set).
    rate_limits: Mapping[str, RateSpec] = field(default_factory=dict)
    # Environment variables the provider reads (captured into `ProviderContext.env`).
    settings: tuple[str, ...] = ()
    # Validates `env` when the provider is selected; raises `ValueError((name, problem))`
    # style errors as `SettingError`.
    check: Callable[[Mapping[str, str]], None] | None = None


class SettingError(ValueError):
    """A provider setting is missing or invalid (`name` is the environment variable)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name = name
        self.problem = problem
