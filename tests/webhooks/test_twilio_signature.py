"""Twilio X-Twilio-Signature verification: the shared vectors as a table, plus signatures
computed here with the auth token for rotation, subaccounts, JSON bodies and tampering."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from litestar.datastructures import FormMultiDict

from tests.support.metrics import value
from tests.webhooks.signing import TWILIO_FIXTURES, twilio_json_url, twilio_signature
from webhooks.errors import VERIFICATION_FAILURES, VerificationFailed
from webhooks.twilio_signature import TwilioVerifier

VECTORS_FILE = json.loads((TWILIO_FIXTURES / "signature-vectors.json").read_text())
VECTORS = VECTORS_FILE["vectors"]
RELATIONAL = VECTORS_FILE["relational_vectors"]

FORM = "application/x-www-form-urlencoded"
JSON = "application/json"

# twilio-node percent-encodes "'" in the URL before signing; twilio-python (and we) use the
# URL exactly as received, so this node-only vector is invalid for us (see PROVENANCE.md).
PYTHON_DIFFERS = {"form-url-special-chars"}

URL = "https://gateway.test/webhooks/twilio/status?d=abc123"
TOKEN = "f" * 32
OLD_TOKEN = "0" * 32
SUB_SID = "AC" + "1" * 32
SUB_TOKEN = "5" * 32
MAIN_SID = "AC" + "9" * 32
PARAMS = {
    "MessageSid": "SM" + "a" * 32,
    "MessageStatus": "delivered",
    "AccountSid": MAIN_SID,
    "To": "+15005550006",
    "ErrorCode": "",
}


def _request(vector: dict[str, Any]) -> dict[str, Any]:
    if "params_multi" in vector:
        return {
            "params": FormMultiDict(vector["params_multi"]),
            "raw_body": None,
            "content_type": FORM,
        }
    if "params" in vector:
        raw = vector.get("raw_body")
        return {
            "params": vector["params"],
            "raw_body": raw.encode() if raw else None,
            "content_type": f"{FORM}; charset=utf-8",
        }
    return {"params": None, "raw_body": vector["raw_body"].encode(), "content_type": JSON}


def test_vector_table_is_complete() -> None:
    assert len(VECTORS) == 20 and len(RELATIONAL) == 9


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["id"])
def test_signature_vectors(vector: dict[str, Any]) -> None:
    expected = vector["expected_valid"] and vector["id"] not in PYTHON_DIFFERS
    verifier = TwilioVerifier(auth_tokens=[vector["auth_token"]])
    request = _request(vector)
    if expected:
        verifier.verify(
            url=vector["url"], signature=vector["signature"], account_sid=None, **request
        )
    else:
        with pytest.raises(VerificationFailed) as info:
            verifier.verify(
                url=vector["url"], signature=vector["signature"], account_sid=None, **request
            )
        assert info.value.reason == "bad_signature"


@pytest.mark.parametrize(
    "vector", RELATIONAL, ids=lambda v: f"{v['signed_url']}->{v['validated_url']}"
)
def test_relational_vectors(vector: dict[str, Any]) -> None:
    expected = vector["expected_valid"] == vector["twilio_python_9_13_agrees"]
    signature = twilio_signature(vector["signed_url"], vector["params"], vector["auth_token"])
    assert signature == vector["computed_signature_for_signed_url"]
    verifier = TwilioVerifier(auth_tokens=[vector["auth_token"]])
    kwargs = {
        "params": vector["params"],
        "raw_body": None,
        "account_sid": None,
        "content_type": FORM,
    }
    if expected:
        verifier.verify(url=vector["validated_url"], signature=signature, **kwargs)
    else:
        with pytest.raises(VerificationFailed):
            verifier.verify(url=vector["validated_url"], signature=signature, **kwargs)


def verify(verifier: TwilioVerifier, **overrides: Any) -> None:
    request: dict[str, Any] = {
        "url": URL,
        "params": PARAMS,
        "raw_body": None,
        "signature": twilio_signature(URL, PARAMS, TOKEN),
        "account_sid": MAIN_SID,
        "content_type": FORM,
    }
    request.update(overrides)
    verifier.verify(**request)


def refused(verifier: TwilioVerifier, reason: str, **overrides: Any) -> None:
    with pytest.raises(VerificationFailed) as info:
        verify(verifier, **overrides)
    assert info.value.reason == reason


def test_valid_form_request() -> None:
    verify(TwilioVerifier(auth_tokens=[TOKEN]))
    verify(TwilioVerifier(auth_tokens=[TOKEN]), account_sid=None)


def test_rotation_accepts_any_configured_token() -> None:
    verifier = TwilioVerifier(auth_tokens=[TOKEN, OLD_TOKEN])
    verify(verifier)
    verify(verifier, signature=twilio_signature(URL, PARAMS, OLD_TOKEN))
    refused(verifier, "bad_signature", signature=twilio_signature(URL, PARAMS, "x" * 32))


@pytest.mark.parametrize(
    "change",
    [
        {"params": {**PARAMS, "MessageStatus": "failed"}},
        {"params": {**PARAMS, "ErrorCode": "30003"}},
        {"params": {**PARAMS, "Extra": "1"}},
        {"params": {k: v for k, v in PARAMS.items() if k != "To"}},
        {"params": {}},
        {"url": URL.replace("https://", "http://")},
        {"url": URL.replace("gateway.test", "gateway.evil")},
        {"url": URL.replace("status", "inbound")},
        {"url": URL + "&x=1"},
        {"url": URL.replace("d=abc123", "d=abc124")},
        {"signature": twilio_signature(URL, PARAMS, TOKEN).lower()},
        {"signature": "not base64 at all"},
    ],
    ids=lambda c: f"{next(iter(c))}:{str(next(iter(c.values())))[-24:]}",
)
def test_any_change_breaks_the_signature(change: dict[str, Any]) -> None:
    refused(TwilioVerifier(auth_tokens=[TOKEN]), "bad_signature", **change)


@pytest.mark.parametrize("signature", [None, ""])
def test_missing_signature(signature: str | None) -> None:
    refused(TwilioVerifier(auth_tokens=[TOKEN]), "missing_signature", signature=signature)


def test_no_token_refuses_everything() -> None:
    verifier = TwilioVerifier(auth_tokens=[])
    assert not verifier.configured
    refused(verifier, "no_token_configured")
    refused(verifier, "no_token_configured", signature=None)
    assert not TwilioVerifier(auth_tokens=["", ""]).configured
    assert TwilioVerifier(auth_tokens=[TOKEN]).configured


def test_subaccount_uses_only_its_own_tokens() -> None:
    verifier = TwilioVerifier(auth_tokens=[TOKEN], subaccount_tokens={SUB_SID: [SUB_TOKEN]})
    sub_params = {**PARAMS, "AccountSid": SUB_SID}
    verify(
        verifier,
        params=sub_params,
        account_sid=SUB_SID,
        signature=twilio_signature(URL, sub_params, SUB_TOKEN),
    )
    # The main account's token does not vouch for the subaccount's callbacks ...
    refused(
        verifier,
        "bad_signature",
        params=sub_params,
        account_sid=SUB_SID,
        signature=twilio_signature(URL, sub_params, TOKEN),
    )
    # ... nor the subaccount's token for anyone else's.
    refused(verifier, "bad_signature", signature=twilio_signature(URL, PARAMS, SUB_TOKEN))
    verify(verifier)


def test_subaccount_tokens_rotate_too() -> None:
    verifier = TwilioVerifier(auth_tokens=[], subaccount_tokens={SUB_SID: ["old", SUB_TOKEN]})
    assert verifier.configured
    for token in ("old", SUB_TOKEN):
        verify(verifier, account_sid=SUB_SID, signature=twilio_signature(URL, PARAMS, token))
    # Only subaccounts configured: any other account has no token at all.
    refused(verifier, "no_token_configured", account_sid=MAIN_SID)
    refused(verifier, "no_token_configured", account_sid=None)


def test_subaccount_with_empty_token_list_falls_back_to_main_tokens() -> None:
    verifier = TwilioVerifier(auth_tokens=[TOKEN], subaccount_tokens={SUB_SID: []})
    verify(verifier, account_sid=SUB_SID)


def test_json_body_via_body_sha256() -> None:
    verifier = TwilioVerifier(auth_tokens=[TOKEN])
    body = json.dumps({"MessageSid": PARAMS["MessageSid"], "Status": "delivered"}).encode()
    url = twilio_json_url(URL, body)
    signature = twilio_signature(url, None, TOKEN)
    json_request = {"url": url, "params": None, "raw_body": body, "content_type": JSON}
    verify(verifier, signature=signature, **json_request)
    verify(
        verifier,
        signature=signature,
        **{**json_request, "content_type": "application/json; charset=utf-8"},
    )
    tampered = body.replace(b"delivered", b"failed")
    refused(
        verifier, "bad_signature", signature=signature, **{**json_request, "raw_body": tampered}
    )
    # Without bodySHA256 the official validator raises TypeError: refused, never a crash.
    refused(
        verifier,
        "bad_signature",
        signature=twilio_signature(URL, None, TOKEN),
        **{**json_request, "url": URL},
    )


def test_non_utf8_json_body_is_refused() -> None:
    body = b"\xff\xfe{}"
    url = twilio_json_url(URL, body)
    refused(
        TwilioVerifier(auth_tokens=[TOKEN]),
        "bad_body_encoding",
        url=url,
        params=None,
        raw_body=body,
        content_type=JSON,
        signature=twilio_signature(url, None, TOKEN),
    )


def test_repeated_form_keys_are_all_signed() -> None:
    pairs = [
        ("MediaUrl", "https://a.example/1"),
        ("MediaUrl", "https://a.example/2"),
        ("Body", "hi"),
    ]
    form = FormMultiDict(pairs)
    verifier = TwilioVerifier(auth_tokens=[TOKEN])
    signature = twilio_signature(URL, form, TOKEN)
    verify(verifier, params=form, signature=signature)
    fewer = FormMultiDict(pairs[1:])
    refused(verifier, "bad_signature", params=fewer, signature=signature)


def test_form_request_without_params_signs_the_url_only() -> None:
    verifier = TwilioVerifier(auth_tokens=[TOKEN])
    verify(verifier, params=None, signature=twilio_signature(URL, {}, TOKEN), content_type="")


def test_failures_are_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gateway.webhooks")
    before = value(VERIFICATION_FAILURES, provider="twilio", reason="bad_signature")
    refused(TwilioVerifier(auth_tokens=[TOKEN]), "bad_signature", signature="AAAA")
    assert value(VERIFICATION_FAILURES, provider="twilio", reason="bad_signature") == before + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.webhooks"]
    assert len(lines) == 1 and "provider=twilio reason=bad_signature" in lines[0]
    assert TOKEN not in lines[0]
    caplog.clear()
    verify(TwilioVerifier(auth_tokens=[TOKEN]))
    assert [r for r in caplog.records if r.name == "gateway.webhooks"] == []
