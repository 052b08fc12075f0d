"""Fixtures of the send-path tests: provider stubs, gateways wired to them, small helpers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from moto.server import ThreadedMotoServer

from gateway.app import create_app
from gateway.services import build_services
from gateway.settings import Settings
from tests.sender.helpers import Gateway, provider_settings
from tests.stubs.ses_stub import SesStub
from tests.stubs.twilio_stub import TwilioStub


@pytest.fixture
def twilio_stub() -> Iterator[TwilioStub]:
    """A fresh Twilio Messages API stub on 127.0.0.1."""
    stub = TwilioStub().start()
    yield stub
    stub.stop()


@pytest.fixture
def ses_stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[SesStub]:
    """A fresh SES v2 stub; the standard AWS_ENDPOINT_URL_SESV2 points boto3 at it."""
    stub = SesStub().start()
    _aws_env(monkeypatch, stub.url)
    yield stub
    stub.stop()


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """moto in server mode on a random local port (module-wide; tests reset it)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_SESV2", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


@pytest.fixture
def moto_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point boto3 at the moto server (clean state) through AWS_ENDPOINT_URL_SESV2."""
    httpx.post(f"{moto_server}/moto-api/reset").raise_for_status()
    _aws_env(monkeypatch, moto_server)
    return moto_server


@pytest.fixture
def make_gateway() -> Callable[..., contextlib.AbstractAsyncContextManager[Gateway]]:
    """Build a gateway (services + app + client) for the given settings."""

    @contextlib.asynccontextmanager
    async def build(settings: Settings, *scopes: str) -> AsyncIterator[Gateway]:
        assert settings.database_url is not None
        services = build_services(settings, settings.database_url)
        app = create_app(services)
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 4711))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="https://gateway.test") as c:
                gw = Gateway(services, c, "")
                gw.secret = await gw.make_key(*(scopes or ("send", "read")))
                yield gw
        finally:
            await services.close()

    return build


@pytest.fixture
async def providers_gateway(
    settings: Settings,
    ses_stub: SesStub,
    twilio_stub: TwilioStub,
    make_gateway: Callable[..., contextlib.AbstractAsyncContextManager[Gateway]],
) -> AsyncIterator[Gateway]:
    """A gateway on the real SES and Twilio adapters, pointed at the local stubs."""
    async with make_gateway(provider_settings(settings, twilio_api_base=twilio_stub.url)) as gw:
        yield gw
