"""The console in a real browser: Playwright drives Debian's Chromium (headless) against
`gateway serve` on a test database with the sandbox providers and the retry worker.

Chromium is a system package (`/usr/bin/chromium`); `./dev test` installs it when it is missing
and runs as root (see README "Operator console"). These tests never skip: without the browser
they fail, saying how to install it.

Screenshots of every page go to `GATEWAY_SCREENSHOT_DIR` when set, else to a folder under
pytest's temporary directory (printed at the end of the module).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway import migrate
from gateway.keys import hash_secret
from sender import log as dlog
from suppression.db import utcnow
from tests.conftest import gateway_env
from tests.support.process import GATEWAY, clean_env, free_port, wait_answering

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_INSTALLED = Path(CHROMIUM).exists()
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Bounds on waiting for the sandbox's callbacks and the worker (guards against hanging, not
# timing assertions).
WAIT_ROUNDS = 150
WAIT_STEP = 0.2


@dataclass
class Server:
    """A running `gateway serve` and keys made for it."""

    url: str
    database_url: str
    admin: str
    read: str
    sender: str


def _insert_key(database_url: str, name: str, scopes: list[str]) -> str:
    secret = "gw_console-" + uuid.uuid4().hex
    engine = create_engine(make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, name, secret_hash, scopes, created_at)"
                    " VALUES (:id, :name, :hash, :scopes, now())"
                ),
                {"id": uuid.uuid4(), "name": name, "hash": hash_secret(secret), "scopes": scopes},
            )
    finally:
        engine.dispose()
    return secret


@pytest.fixture(scope="module")
def server(
    create_database: Callable[[], str], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """`gateway serve` on a database of its own (the module's tests share it); its output goes
    to a file (a pipe nobody reads would fill up and stall the server)."""
    database_url = create_database()
    migrate.upgrade(database_url)
    port = free_port()
    env = clean_env(
        **gateway_env(
            database_url,
            redis_url,
            GATEWAY_REDIS_PREFIX=f"gwtest:{uuid.uuid4().hex[:8]}:",
            GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port}",
            GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS="0.05",
            GATEWAY_RETRY_WORKER_POLL_SECONDS="0.2",
        )
    )
    log = (tmp_path_factory.mktemp("console-server") / "serve.log").open("w")
    proc = subprocess.Popen(
        [GATEWAY, "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_answering(proc, port, "/healthz")
        yield Server(
            url=f"http://127.0.0.1:{port}",
            database_url=database_url,
            admin=_insert_key(database_url, "console admin", ["admin"]),
            read=_insert_key(database_url, "console reader", ["read"]),
            sender=_insert_key(database_url, "upstream", ["send", "read"]),
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where screenshots go (GATEWAY_SCREENSHOT_DIR, else a pytest temporary folder)."""
    configured = os.environ.get("GATEWAY_SCREENSHOT_DIR")
    folder = Path(configured) if configured else tmp_path_factory.mktemp("console-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    yield folder
    print(f"\nconsole screenshots: {folder}")


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    """Debian's Chromium, headless; fails (never skips) when it is not installed."""
    assert CHROMIUM_INSTALLED, (
        f"{CHROMIUM} is missing: install Debian's chromium package "
        "(./dev test does so when it runs as root: apt-get install -y chromium)"
    )
    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def _page(browser: Browser) -> Page:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    return await context.new_page()


async def sign_in(page: Page, server: Server, secret: str) -> None:
    """Sign in with the keyboard: type the key and press Enter."""
    await page.goto(f"{server.url}/console/login")
    await page.get_by_label("API key").fill(secret)
    await page.get_by_label("API key").press("Enter")
    await page.wait_for_url(f"{server.url}/console")


async def send(server: Server, channel: str, to: str, **extra: Any) -> dict[str, Any]:
    """Send a message through the API as an upstream service would."""
    body: dict[str, Any] = {"channel": channel, "to": [to], **extra}
    if channel == "email":
        body.setdefault("subject", "Hello")
        body.setdefault("text", "Hello from the console test")
    else:
        body.setdefault("body", "Hello from the console test")
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.post(
            "/v1/messages",
            json=body,
            headers={
                "Authorization": f"Bearer {server.sender}",
                "Idempotency-Key": uuid.uuid4().hex,
            },
        )
    assert answer.status_code in (201, 202), answer.text
    created: dict[str, Any] = answer.json()
    return created


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll `check` until it holds (bounded: a guard against hanging)."""
    for _ in range(WAIT_ROUNDS):
        if await check():
            return
        await asyncio.sleep(WAIT_STEP)
    raise AssertionError(f"never happened: {what}")


async def delivery_status(server: Server, message_id: str) -> str:
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.get(
            f"/v1/messages/{message_id}", headers={"Authorization": f"Bearer {server.sender}"}
        )
    status: str = answer.json()["deliveries"][0]["status"]
    return status


async def test_look_up_a_bounced_address_then_remove_its_suppression(
    browser: Browser, server: Server, shots: Path
) -> None:
    address = f"bounce+{uuid.uuid4().hex[:8]}@simulator.amazonses.com"
    sent = await send(server, "email", address)

    async def bounced() -> bool:
        return await delivery_status(server, sent["id"]) == "bounced"

    await until(bounced, "the sandbox's bounce")
    page = await _page(browser)
    await sign_in(page, server, server.admin)
    await page.get_by_role("link", name="Address").click()
    await page.get_by_label("Channel").select_option("email")
    await page.get_by_label("Email address or phone number").fill(address)
    await page.get_by_role("button", name="Look up").click()
    await page.wait_for_selector("#entries")
    assert await page.locator("#verdict").inner_text() == "suppressed"
    assert "hard_bounce" in await page.locator("#entries").inner_text()
    deliveries = await page.locator("#deliveries").inner_text()
    assert "bounced" in deliveries
    await page.screenshot(path=str(shots / "address.png"), full_page=True)

    # The message's timeline shows the provider's events with their disposition.
    await page.locator("#deliveries").get_by_role("link", name="timeline").first.click()
    await page.wait_for_selector("#timeline")
    timeline = await page.locator("#timeline").inner_text()
    assert "ses bounce: applied" in timeline
    assert "Attempt 1" in timeline
    await page.locator("#timeline details summary", has_text="raw payload").first.click()
    await page.screenshot(path=str(shots / "message.png"), full_page=True)

    # Remove the suppression with a reason; the removal is in the history.
    await page.go_back()
    await page.get_by_label("Why (required, kept in history)").fill("mailbox fixed, ticket 42")
    await page.get_by_role("button", name="Remove suppression").click()
    await page.wait_for_selector("text=The suppression was removed.")
    assert await page.locator("#verdict").inner_text() == "not suppressed"
    history = await page.locator("#history").inner_text()
    assert "remove" in history and "mailbox fixed, ticket 42" in history
    await page.screenshot(path=str(shots / "address-removed.png"), full_page=True)


async def test_redrive_a_dead_letter_and_see_it_sent(
    browser: Browser, server: Server, shots: Path
) -> None:
    sent = await send(server, "email", f"success+{uuid.uuid4().hex[:8]}@simulator.amazonses.com")
    delivery_id = uuid.UUID(sent["deliveries"][0]["id"])

    async def settled() -> bool:
        return await delivery_status(server, sent["id"]) == "delivered"

    await until(settled, "the sandbox's delivery")
    # The retry worker gives up on a delivery through the delivery log's `dead_letter`; do
    # what it does (the sandbox has no address that fails a while and then succeeds).
    conn = await asyncpg.connect(server.database_url)
    try:
        async with conn.transaction():
            entry_id = await dlog.dead_letter(
                conn,
                delivery_id,
                reason="max_attempts",
                last_error="421 try again later",
                now=utcnow(),
            )
    finally:
        await conn.close()
    page = await _page(browser)
    await sign_in(page, server, server.admin)
    await page.get_by_role("link", name="Dead letters").click()
    await page.get_by_label("Channel").select_option("email")
    await page.get_by_label("Reason").select_option("max_attempts")
    await page.get_by_role("button", name="Filter").click()
    await page.wait_for_selector("#dlq")
    await page.screenshot(path=str(shots / "dlq.png"), full_page=True)
    await page.locator(f"#sel-{entry_id}").check()
    await page.get_by_role("button", name="Redrive selected").click()
    assert "Redrive 1 dead-letter entry?" in await page.locator("h1").inner_text()
    await page.screenshot(path=str(shots / "dlq-confirm.png"), full_page=True)
    await page.get_by_role("button", name="Yes, redrive 1").click()
    assert "1 entry redriven" in await page.locator("#result").inner_text()

    async def sent_again() -> bool:
        await page.goto(f"{server.url}/console/dlq/{entry_id}")
        status = await page.locator("#delivery-status").inner_text()
        return status in ("sent", "delivered")

    await until(sent_again, "the redriven delivery sent")
    assert await page.locator("#entry-state").inner_text() == "redriven"
    await page.screenshot(path=str(shots / "dlq-entry.png"), full_page=True)
    await page.get_by_role("link", name="timeline").click()
    timeline = await page.locator("#timeline").inner_text()
    assert "Attempt 2" in timeline and "Dead letter redriven" in timeline


async def test_overview_counts_change_after_sandbox_traffic(
    browser: Browser, server: Server, shots: Path
) -> None:
    page = await _page(browser)
    await sign_in(page, server, server.read)

    async def count(status: str) -> int:
        cell = page.locator(f'#counts-sms tr[data-window="24h"] td[data-status="{status}"]')
        return int(await cell.inner_text())

    before = await count("delivered")
    before_total = await count("total")
    sent = await send(server, "sms", "+15005550006")

    async def delivered() -> bool:
        return await delivery_status(server, sent["id"]) == "delivered"

    await until(delivered, "the sandbox's SMS delivery")
    await page.reload()
    assert await count("delivered") == before + 1
    assert await count("total") == before_total + 1
    await page.screenshot(path=str(shots / "overview.png"), full_page=True)


async def test_a_read_only_key_sees_no_actions_and_is_refused(
    browser: Browser, server: Server, shots: Path
) -> None:
    page = await _page(browser)
    await sign_in(page, server, server.read)
    await page.goto(f"{server.url}/console/suppressions")
    assert await page.get_by_role("button", name="Import").count() == 0
    await page.screenshot(path=str(shots / "suppressions.png"), full_page=True)
    await page.goto(f"{server.url}/console/dlq?state=all")
    assert await page.get_by_role("button", name="Redrive selected").count() == 0
    # The server refuses the action anyway: post the form the page would have had.
    csrf = await page.locator('input[name="csrf"]').first.get_attribute("value")
    answer = await page.request.post(
        f"{server.url}/console/dlq/action",
        form={"csrf": csrf or "", "action": "redrive", "ids": str(uuid.uuid4())},
    )
    assert answer.status == 403
    assert "scope admin" in await answer.text()
    await page.set_content(await answer.text())
    await page.screenshot(path=str(shots / "refused.png"), full_page=True)


UNLABELLED = """() => [...document.querySelectorAll(
    'input:not([type=hidden]), select, textarea, button')]
  .filter(e => e.tagName === 'BUTTON'
    ? !e.innerText.trim()
    : !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
  .map(e => e.outerHTML)"""


async def test_every_page_has_a_title_labelled_controls_and_a_keyboard_path(
    browser: Browser, server: Server
) -> None:
    page = await _page(browser)
    await sign_in(page, server, server.admin)
    paths = [
        "/console",
        "/console/address?channel=email&address=someone%40example.com",
        "/console/messages",
        "/console/dlq?state=all",
        "/console/suppressions",
        f"/console/messages/{uuid.uuid4()}",
    ]
    for path in paths:
        await page.goto(server.url + path)
        assert (await page.title()).endswith("Gateway console"), path
        assert await page.locator("h1").count() == 1, path
        assert await page.evaluate(UNLABELLED) == [], path
    # The keyboard alone: the skip link comes first and leads to the content.
    await page.goto(server.url + "/console")
    await page.keyboard.press("Tab")
    focused = await page.evaluate("() => document.activeElement.textContent")
    assert focused == "Skip to content"
    await page.keyboard.press("Enter")
    assert await page.evaluate("() => document.activeElement.id") == "main"


async def test_import_a_file_then_export_the_list(
    browser: Browser, server: Server, shots: Path, tmp_path: Path
) -> None:
    page = await _page(browser)
    await page.goto(f"{server.url}/console/login")
    await page.screenshot(path=str(shots / "login.png"), full_page=True)
    await sign_in(page, server, server.admin)
    await page.goto(f"{server.url}/console/suppressions")
    upload = tmp_path / "list.csv"
    upload.write_text(
        "channel,address,reason,scope\n"
        "email,imported@example.com,complaint,all\n"
        "sms,+1 500 555 0009,sms_stop,all\n"
        "email,not an address,hard_bounce,all\n"
    )
    await page.get_by_label("File (CSV or JSON Lines: ours, SES or SendGrid)").set_input_files(
        str(upload)
    )
    await page.get_by_role("button", name="Import").click()
    await page.wait_for_selector("#report")
    assert await page.locator('[data-field="added"]').inner_text() == "2"
    assert await page.locator('[data-field="invalid_count"]').inner_text() == "1"
    await page.screenshot(path=str(shots / "import-report.png"), full_page=True)
    await page.goto(f"{server.url}/console/suppressions?reason=complaint")
    assert "imported@example.com" in await page.locator("#suppressions").inner_text()
    async with page.expect_download() as info:
        await page.get_by_role("link", name="Export the whole list (CSV, with history)").click()
    download = await info.value
    saved = tmp_path / "export.csv"
    await download.save_as(str(saved))
    async with httpx.AsyncClient(base_url=server.url) as client:
        api = await client.get(
            "/v1/suppressions/export", headers={"Authorization": f"Bearer {server.admin}"}
        )
    assert saved.read_text() == api.text
    assert "imported@example.com" in api.text and "+15005550009" in api.text
