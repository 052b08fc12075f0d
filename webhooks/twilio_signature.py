"""Twilio webhook verification (``X-Twilio-Signature``) with the official RequestValidator.

The signature is an HMAC-SHA1, keyed with an Auth Token, over the URL Twilio requested
(scheme, host, path and query exactly as received; behind a proxy that is
``GATEWAY_PUBLIC_URL`` + path + query, built by the caller) followed by every POST parameter
sorted by name. JSON bodies are signed over the URL only, and the URL carries
``bodySHA256=<hex sha256 of the body>``, which the validator checks against the raw body.

Decisions:

* The URL is used exactly as given: no normalisation of quoting (twilio-node turns ``'``
  into ``%27``, twilio-python does not; we behave as twilio-python). The validator itself
  also tries the URL with the default port added and with any port removed.
* Several tokens may be valid at once (rotation); any of them is accepted.
* When the posted ``AccountSid`` has tokens in `subaccount_tokens`, only those tokens are
  tried: a subaccount's callbacks are signed with the subaccount's token, and accepting the
  main account's tokens there would let one credential vouch for another account. Any other
  AccountSid (or none) is checked against the main `auth_tokens`.
* No token for the request's account: refused with ``no_token_configured`` (fail closed).
* A JSON body without ``bodySHA256`` makes the validator raise TypeError; that is invalid.
* The HMAC-SHA256 "SharedKey" scheme (header ``X-Twilio-Webhooks-Signature-Settings``) is not
  supported: such requests fail as ``bad_signature`` because no SharedKey is configured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twilio.request_validator import RequestValidator

from webhooks.errors import VerificationFailed, record_failure

__all__ = ["FORM_CONTENT_TYPES", "TwilioVerifier"]

FORM_CONTENT_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


class _Params(dict[str, str]):
    # The validator looks for getall()/getlist() before plain indexing; a plain dict costs
    # two caught AttributeErrors per parameter per pass, so offer getall() directly.
    def getall(self, name: str) -> list[str]:
        return [self[name]]


class TwilioVerifier:
    """Checks ``X-Twilio-Signature`` against the configured Auth Tokens."""

    def __init__(
        self,
        *,
        auth_tokens: Sequence[str],
        subaccount_tokens: Mapping[str, Sequence[str]] = {},  # read only, never mutated
    ) -> None:
        self._main = tuple(RequestValidator(token) for token in dict.fromkeys(auth_tokens) if token)
        self._sub = {
            sid: tuple(RequestValidator(token) for token in dict.fromkeys(tokens) if token)
            for sid, tokens in subaccount_tokens.items()
        }
        self._sub = {sid: validators for sid, validators in self._sub.items() if validators}

    @property
    def configured(self) -> bool:
        """False when no token at all is configured; `verify` then refuses everything."""
        return bool(self._main or self._sub)

    def verify(
        self,
        *,
        url: str,
        params: Mapping[str, str] | None,
        raw_body: bytes | None,
        signature: str | None,
        account_sid: str | None,
        content_type: str,
    ) -> None:
        """Raise `VerificationFailed` unless `signature` is valid for this request.

        `params` are the posted form fields (a multi-dict with ``getall``/``getlist`` keeps
        repeated keys); `raw_body` is used instead for non-form bodies (JSON, via
        ``bodySHA256``). `account_sid` selects subaccount tokens when configured.
        """
        try:
            self._verify(url, params, raw_body, signature, account_sid, content_type)
        except VerificationFailed as error:
            record_failure("twilio", error)
            raise

    def _verify(
        self,
        url: str,
        params: Mapping[str, str] | None,
        raw_body: bytes | None,
        signature: str | None,
        account_sid: str | None,
        content_type: str,
    ) -> None:
        validators = self._sub.get(account_sid or "") or self._main
        if not validators:
            raise VerificationFailed(
                "no Twilio auth token configured for this account: refusing all",
                reason="no_token_configured",
            )
        if not signature:
            raise VerificationFailed("X-Twilio-Signature is missing", reason="missing_signature")

        payload: Any
        media_type = content_type.split(";", 1)[0].strip().lower()
        if media_type in FORM_CONTENT_TYPES or not raw_body:
            payload = _form_params(params)
        else:
            try:
                payload = raw_body.decode("utf-8")
            except UnicodeDecodeError:
                raise VerificationFailed(
                    "request body is not UTF-8", reason="bad_body_encoding"
                ) from None

        for validator in validators:
            try:
                if validator.validate(url, payload, signature):
                    return
            except TypeError:
                # twilio-python raises on a JSON body whose URL lacks bodySHA256 (and on
                # non-text form values): not a valid Twilio request either way.
                raise VerificationFailed(
                    "request cannot be validated (JSON body without bodySHA256 in the URL?)",
                    reason="bad_signature",
                ) from None
        raise VerificationFailed("X-Twilio-Signature does not match", reason="bad_signature")


def _form_params(params: Mapping[str, str] | None) -> Mapping[str, str]:
    if params is None:
        return _Params()
    if hasattr(params, "getall") or hasattr(params, "getlist"):
        return params  # a multi-dict: repeated keys are all signed
    return _Params(params)
