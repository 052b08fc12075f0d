"""The vocabulary of provider error classes and the shape of a provider's error table.

Both directions classify a provider's codes with the same table: the send path
(`sender.classify`, the code a provider call returned) and the feedback path
(`webhooks.classify`, the code a callback carried). A provider's table lives in its own
module next to its adapter (`sender/providers/twilio_spec.py`, `ses_spec.py`); this module
only names the classes, so those tables can be imported by both sides without a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ACCEPTED = "accepted"
TRANSIENT = "transient"
PERMANENT_MESSAGE = "permanent_message"
PERMANENT_ADDRESS = "permanent_address"
RECIPIENT = "recipient"
DESTINATION = "destination"
ACCOUNT = "account"
UNKNOWN_OUTCOME = "unknown_outcome"

CLASSES: tuple[str, ...] = (
    ACCEPTED,
    TRANSIENT,
    PERMANENT_MESSAGE,
    PERMANENT_ADDRESS,
    RECIPIENT,
    DESTINATION,
    ACCOUNT,
    UNKNOWN_OUTCOME,
)


@dataclass(frozen=True)
class ErrorTable:
    """One provider's error codes: `code -> (class, description)`.

    `opt_out`: codes of class `permanent_address` that mean "the recipient opted out"
    (suppressed as `sms_stop`, not `invalid_address`). `recipient_scoped`: transient codes
    about one message, sender or recipient, which never count against the provider's
    circuit breaker.
    """

    provider: str
    codes: Mapping[str, tuple[str, str]]
    opt_out: frozenset[str] = field(default_factory=frozenset)
    recipient_scoped: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for code, (kind, _) in self.codes.items():
            if kind not in CLASSES or kind in (ACCEPTED, UNKNOWN_OUTCOME):
                raise ValueError(f"{self.provider}:{code}: {kind!r} is not an error class")
        for code in self.opt_out:
            if self.codes.get(code, ("",))[0] != PERMANENT_ADDRESS:
                raise ValueError(f"{self.provider}:{code}: an opt-out code must be an address one")
