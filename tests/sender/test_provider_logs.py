"""Sends through the real boto3 and twilio clients (to the local stubs) with every logger at
DEBUG: the lines a gateway process would write hold no recipient and no message body, while
the libraries' own DEBUG records were produced (and so were checked)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.logs import formatter
from tests.sender.helpers import Gateway, email, sms
from tests.support.leaks import find_leaks

MARKER = "BODY-MARKER-9c8d7e6f"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    root = logging.getLogger()
    saved = root.level
    levels = {name: logging.getLogger(name).level for name in ("botocore", "twilio", "urllib3")}
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield stream
    root.removeHandler(handler)
    root.setLevel(saved)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


async def test_provider_debug_lines_hold_no_recipient_or_body(
    providers_gateway: Gateway, lines: io.StringIO
) -> None:
    gw = providers_gateway
    sent = await gw.send(email("ann@example.com", subject=MARKER, text=MARKER, html=MARKER))
    assert sent.status_code == 201, sent.text
    sent = await gw.send(sms("+14155552671", body=MARKER))
    assert sent.status_code == 201, sent.text
    objects = [json.loads(line) for line in lines.getvalue().splitlines() if line.strip()]
    loggers = {o["logger"] for o in objects}
    assert any(name.startswith("botocore") for name in loggers), loggers
    assert "twilio.http_client" in loggers
    text = lines.getvalue()
    assert find_leaks(text) == []
    assert "ann@example.com" not in text and "4155552671" not in text
