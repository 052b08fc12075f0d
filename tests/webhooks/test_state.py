"""The advance-only state machine: ranks, dispositions, and order independence (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sender.status import CANCELLED, GATEWAY_STATES, SENDING, SUPPRESSED
from webhooks.state import (
    APPLIED,
    DUPLICATE,
    IGNORED,
    REGRESSION,
    TRANSIENT,
    rank,
    replay,
    states,
    step,
)

CHANNELS = ("email", "sms")


def test_rank_tables_follow_the_design() -> None:
    assert states("email") == (
        "sent",
        "delayed",
        "delivered",
        "transient",
        "failed",
        "bounced",
        "complained",
    )
    assert states("sms") == ("sent", "delivered", "transient", "failed", "read")
    for channel in CHANNELS:
        for gateway_state in [*GATEWAY_STATES, None, "in_progress"]:
            assert rank(channel, gateway_state) < rank(channel, "sent")


@pytest.mark.parametrize(
    ("channel", "events", "expected"),
    [
        # Out of order: Delivery then Bounce -> bounced; delivered then sent -> delivered.
        ("email", ["delivered", "bounced"], ("bounced", "bounced")),
        ("email", ["bounced", "delivered"], ("bounced", "bounced")),
        ("email", ["delivered", "sent"], ("delivered", "delivered")),
        ("sms", ["delivered", "sent"], ("delivered", "delivered")),
        ("email", ["complained", "bounced", "delivered"], ("complained", "complained")),
        ("email", ["delayed", "sent"], ("delayed", "delayed")),
        # A delay is never a bounce, and a soft bounce beats a delay.
        ("email", ["delayed", "transient"], ("transient", "retrying")),
        ("sms", ["sent", "transient", "delivered"], ("transient", "retrying")),
        ("sms", ["failed", "read"], ("read", "read")),
        # Engagement (None) never moves anything.
        ("email", [None, "sent", None], ("sent", "sent")),
        ("email", [None], (None, "queued")),
    ],
)
def test_examples(channel: str, events: list[str | None], expected: tuple[str | None, str]) -> None:
    assert replay(channel, "queued", events) == expected


def test_dispositions() -> None:
    def disposition(current: str, new: str | None) -> str:
        return step(
            "email", attempt_state=current, delivery_status="sent", new_state=new
        ).disposition

    assert disposition("sent", "delivered") == APPLIED
    assert disposition("sent", "sent") == DUPLICATE
    assert disposition("delivered", "sent") == REGRESSION
    assert disposition("sent", None) == IGNORED


@pytest.mark.parametrize("never_sent", [SUPPRESSED, CANCELLED])
def test_suppressed_and_cancelled_never_move(never_sent: str) -> None:
    # A cancelled campaign delivery was never handed to the provider by this queue entry: a
    # late callback (of an older attempt) is recorded on that attempt only.
    for channel in CHANNELS:
        for state in states(channel):
            result = step(channel, attempt_state=None, delivery_status=never_sent, new_state=state)
            assert result.delivery_status is None
            assert result.attempt_state == state  # the attempt's own record still advances


def test_transient_retries_or_dies_by_budget() -> None:
    go = step("email", attempt_state="sent", delivery_status="sent", new_state=TRANSIENT)
    assert (go.delivery_status, go.cancel_retry) == ("retrying", False)
    stop = step(
        "email", attempt_state="sent", delivery_status="sent", new_state=TRANSIENT, can_retry=False
    )
    assert stop.delivery_status == "dead"
    # Already waiting for a retry (or dead): nothing more to schedule.
    again = step("sms", attempt_state=None, delivery_status="retrying", new_state=TRANSIENT)
    assert again.disposition == APPLIED and again.delivery_status is None


def test_provider_word_revives_gateway_states_and_cancels_the_retry() -> None:
    for status in ("unknown", "retrying", "dead", "queued"):
        result = step("sms", attempt_state=None, delivery_status=status, new_state="delivered")
        assert (result.delivery_status, result.cancel_retry) == ("delivered", True)


def test_older_attempts_only_revive_with_positive_outcomes() -> None:
    def older(status: str, new: str) -> str | None:
        return step(
            "email", attempt_state="sent", delivery_status=status, new_state=new, latest=False
        ).delivery_status

    assert older("retrying", "delivered") == "delivered"
    assert older("dead", "sent") is None  # the older attempt was already "sent"
    assert older("unknown", "delayed") == "delayed"
    assert older(SENDING, "delivered") is None  # a newer call is in flight
    assert older("delivered", "bounced") is None  # the latest attempt decides
    assert older("retrying", "bounced") is None
    assert older("retrying", TRANSIENT) is None


def test_states_a_channel_lacks_are_rejected() -> None:
    with pytest.raises(ValueError, match="not a provider state"):
        step("sms", attempt_state=None, delivery_status="sent", new_state="delayed")


@st.composite
def callbacks(draw: st.DrawFn) -> tuple[str, str, bool, list[str | None], list[str | None]]:
    """A channel, a start status, a retry budget flag, a set of callbacks in canonical
    order, and the same set permuted with duplicates."""
    channel = draw(st.sampled_from(CHANNELS))
    options: list[str | None] = [*states(channel), None]
    chosen = draw(st.lists(st.sampled_from(options), min_size=1, unique=True))
    canonical = sorted(chosen, key=lambda s: rank(channel, s))
    extra = draw(st.lists(st.sampled_from(chosen), max_size=6))
    shuffled = draw(st.permutations([*chosen, *extra]))
    start = draw(st.sampled_from(sorted(GATEWAY_STATES)))
    return channel, start, draw(st.booleans()), canonical, list(shuffled)


@given(callbacks())
def test_any_permutation_with_duplicates_ends_like_canonical_order(
    case: tuple[str, str, bool, list[str | None], list[str | None]],
) -> None:
    channel, start, can_retry, canonical, shuffled = case
    expected = replay(channel, start, canonical, can_retry=can_retry)
    assert replay(channel, start, shuffled, can_retry=can_retry) == expected
    # ... and that end state is the highest-ranked event's.
    top = max(canonical, key=lambda s: rank(channel, s))
    assert expected[0] == top
    if top is None:
        assert expected[1] == start
    elif top == TRANSIENT:
        assert expected[1] == ("retrying" if can_retry else "dead")
    else:
        assert expected[1] == top
