"""The feedback ingestor on a real database: store once, correlate, advance, classify, act."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import uuid

import pytest
from sqlalchemy import select, update

from gateway.services import Services
from retry.models import DeadLetter
from sender.models import Attempt, Delivery
from suppression import service
from suppression.normalize import normalize
from tests.support.metrics import value
from tests.webhooks.feedback import (
    PHONE,
    delivery_state,
    hash_of,
    history,
    make_delivery,
    ses_event,
    ses_payload,
    status_params,
    stored_events,
    suppressions,
    twilio_form,
)
from webhooks.ingest import PROVIDER_FLAGS, FeedbackIngestor

JANE = "jane@example.com"
PHONE2 = "+15005550010"


@pytest.fixture
def ingestor(services: Services) -> FeedbackIngestor:
    ingestor: FeedbackIngestor = services.ingestor
    return ingestor


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- SES ----------------------------------------------------------------------------------


async def test_hard_bounce_bounces_the_delivery_and_suppresses_the_address(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, attempts=[("accepted", "ses-1")])
    message = ses_event("Bounce", message_id="ses-1", bounce_subtype="NoEmail")
    assert await ingestor.ses_message(message, event_id="sns-1") == ["applied"]

    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (delivery.status, delivery.reason) == ("bounced", "hard_bounce")
    assert delivery.last_error is not None and JANE not in delivery.last_error
    assert (attempt.provider_status, attempt.error_code) == ("bounced", "5.1.1")
    (entry,) = await suppressions(services)
    assert (entry.channel, entry.reason, entry.scope, entry.expires_at) == (
        "email",
        "hard_bounce",
        "all",
        None,
    )
    assert (entry.source_type, entry.source_id) == ("provider_event", "sns-1")
    assert entry.evidence["bounce_subtype"] == "NoEmail"
    (row,) = await stored_events(services)
    assert (row.provider, row.provider_event_id, row.event_type, row.disposition) == (
        "ses",
        "sns-1",
        "bounce",
        "applied",
    )
    assert (row.delivery_id, row.attempt_id) == (made.delivery_id, made.attempt_ids[0])
    assert row.recipient_hash == made.recipient_hash
    # The raw payload is kept, encrypted; nothing in plaintext names the address.
    assert row.payload_encrypted is not None and JANE not in row.payload_encrypted
    assert json.loads(services.protector.decrypt(row.payload_encrypted)) == message
    assert JANE not in json.dumps(row.details) and JANE not in json.dumps(entry.evidence)
    (added,) = await history(services)
    assert (added.action, added.actor, added.reason) == ("add", "ses", "hard_bounce")


async def test_multi_recipient_bounce_suppresses_every_address_even_when_parked(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    message = ses_payload("awsdocs-notification-bounce-permanent-general-no-dsn.json")
    assert await ingestor.ses_message(message, event_id="sns-2") == ["parked", "parked"]
    rows = await stored_events(services)
    assert sorted(r.provider_event_id for r in rows) == ["sns-2#0", "sns-2#1"]
    hashes = {e.address_hash for e in await suppressions(services)}
    assert hashes == {
        hash_of(services, "email", "jane@example.com"),
        hash_of(services, "email", "richard@example.com"),
    }


async def test_complaints_and_not_spam(services: Services, ingestor: FeedbackIngestor) -> None:
    made = await make_delivery(services, status="delivered", attempts=[("accepted", "c-1")])
    not_spam = ses_event("Complaint", message_id="c-1", feedback_type="not-spam")
    assert await ingestor.ses_message(not_spam, event_id="n1") == ["ignored"]
    assert (await delivery_state(services, made.delivery_id))[0].status == "delivered"
    assert await suppressions(services) == []

    complaint = ses_event(
        "Complaint", message_id="c-1", feedback_type="abuse", shape="notification"
    )
    assert await ingestor.ses_message(complaint, event_id="n2") == ["applied"]
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (delivery.status, attempt.provider_status) == ("complained", "complained")
    assert [(e.reason, e.scope) for e in await suppressions(services)] == [("complaint", "all")]


async def test_delay_is_never_a_bounce_and_reject_never_suppresses(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, attempts=[("accepted", "d-1")])
    assert await ingestor.ses_message(
        ses_event("DeliveryDelay", message_id="d-1"), event_id="a"
    ) == ["applied"]
    assert (await delivery_state(services, made.delivery_id))[0].status == "delayed"
    assert await ingestor.ses_message(ses_event("Delivery", message_id="d-1"), event_id="b") == [
        "applied"
    ]
    assert (await delivery_state(services, made.delivery_id))[0].status == "delivered"

    other = await make_delivery(services, to="x@example.com", attempts=[("accepted", "r-1")])
    reject = ses_event("Reject", message_id="r-1", recipients=("x@example.com",))
    assert await ingestor.ses_message(reject, event_id="c") == ["applied"]
    assert (await delivery_state(services, other.delivery_id))[0].status == "failed"
    failure = ses_event("Rendering Failure", message_id="r-1", recipients=("x@example.com",))
    assert await ingestor.ses_message(failure, event_id="d") == ["duplicate"]
    assert await suppressions(services) == []


@pytest.mark.parametrize(
    ("order", "final", "dispositions"),
    [
        (["Delivery", "Bounce"], "bounced", ["applied", "applied"]),
        (["Bounce", "Delivery"], "bounced", ["applied", "regression"]),
        (["Delivery", "Send"], "delivered", ["applied", "regression"]),
        (["Send", "Send"], "sent", ["applied", "duplicate"]),
    ],
)
async def test_out_of_order_events_end_in_the_highest_state(
    services: Services,
    ingestor: FeedbackIngestor,
    order: list[str],
    final: str,
    dispositions: list[str],
) -> None:
    made = await make_delivery(services, status="sending", attempts=[("accepted", "o-1")])
    got = []
    for index, kind in enumerate(order):
        got += await ingestor.ses_message(ses_event(kind, message_id="o-1"), event_id=f"o{index}")
    assert got == dispositions
    assert (await delivery_state(services, made.delivery_id))[0].status == final


async def test_shuffled_and_repeated_events_end_like_canonical_order(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    # The pure property (tests/webhooks/test_state.py) checked through the real store: each
    # round feeds the same callbacks in canonical order to one delivery and shuffled, with
    # SNS redeliveries, to another; both must end in the same state.
    kinds = ["Send", "DeliveryDelay", "Delivery", "Open", "Bounce"]
    rng = random.Random(4711)
    for round_ in range(6):
        chosen = rng.sample(kinds, rng.randint(1, len(kinds)))
        canonical = [k for k in kinds if k in chosen]
        shuffled = rng.sample(chosen, len(chosen)) + rng.choices(chosen, k=3)
        ends = []
        for label, order in (("c", canonical), ("s", shuffled)):
            pmid = f"perm-{round_}-{label}"
            to = f"{pmid}@example.com"
            made = await make_delivery(
                services, to=to, status="sending", attempts=[("accepted", pmid)]
            )
            for kind in order:
                message = ses_event(kind, message_id=pmid, recipients=(to,))
                await ingestor.ses_message(message, event_id=f"{pmid}-{kind}")
            delivery, (attempt,) = await delivery_state(services, made.delivery_id)
            ends.append((delivery.status, attempt.provider_status))
        assert ends[0] == ends[1], (canonical, shuffled)


async def test_duplicates_have_one_effect(services: Services, ingestor: FeedbackIngestor) -> None:
    await make_delivery(services, attempts=[("accepted", "dup-1")])
    message = ses_event("Bounce", message_id="dup-1")
    assert await ingestor.ses_message(message, event_id="same") == ["applied"]
    assert await ingestor.ses_message(message, event_id="same") == ["duplicate"]
    assert len(await stored_events(services)) == 1
    assert [h.action for h in await history(services)] == ["add"]


async def test_concurrent_copies_have_one_effect(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMc")])
    params = status_params("SMc", "undelivered", to=PHONE, error_code="21610")
    results = await asyncio.gather(
        *[ingestor.twilio_status(params, query={}, idempotency_token="tok-1") for _ in range(4)]
    )
    assert sorted(r[0] for r in results) == ["applied", "duplicate", "duplicate", "duplicate"]
    assert len(await stored_events(services)) == 1
    assert [(h.action, h.reason) for h in await history(services)] == [("add", "sms_stop")]
    assert (await delivery_state(services, made.delivery_id))[0].status == "failed"


# ---- correlation ------------------------------------------------------------------------


async def test_callback_before_commit_is_parked_then_applied(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(
        services, channel="sms", to=PHONE, status="sending", attempts=[("in_progress", None)]
    )
    params = status_params("SMp", "delivered", to=PHONE)
    got = await ingestor.twilio_status(
        params, query={"d": str(made.delivery_id)}, idempotency_token=None
    )
    assert got == ["parked"]
    (row,) = await stored_events(services)
    assert (row.disposition, row.delivery_id, row.provider_message_id) == (
        "parked",
        made.delivery_id,
        "SMp",
    )
    # Nothing to apply for another message id.
    assert await ingestor.apply_parked("twilio", "SMother") == 0
    # The send path records the provider id and status, commits, then asks for parked events.
    async with services.sessions() as session:
        await session.execute(
            update(Attempt)
            .where(Attempt.id == made.attempt_ids[0])
            .values(status="accepted", provider_message_id="SMp")
        )
        await session.execute(
            update(Delivery)
            .where(Delivery.id == made.delivery_id)
            .values(status="sent", provider_message_id="SMp")
        )
        await session.commit()
    assert await ingestor.apply_parked("twilio", "SMp") == 1
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (delivery.status, attempt.provider_status) == ("delivered", "delivered")
    (row,) = await stored_events(services)
    assert (row.disposition, row.attempt_id) == ("applied", made.attempt_ids[0])
    assert await ingestor.apply_parked("twilio", "SMp") == 0


async def test_parked_events_are_applied_when_the_next_event_arrives(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    # SES identity notifications carry no tag: the first one comes before the send recorded.
    send = ses_event("Send", message_id="late-1", shape="event")
    assert await ingestor.ses_message(send, event_id="first") == ["parked"]
    made = await make_delivery(services, status="sent", attempts=[("accepted", "late-1")])
    bounce = ses_event("Bounce", message_id="late-1", shape="notification")
    assert await ingestor.ses_message(bounce, event_id="second") == ["applied"]
    rows = {r.provider_event_id: r for r in await stored_events(services)}
    # The parked event is applied first (it arrived first), then the new one.
    assert (rows["first"].disposition, rows["first"].delivery_id) == ("applied", made.delivery_id)
    assert (await delivery_state(services, made.delivery_id))[1][0].provider_status == "bounced"
    assert (await delivery_state(services, made.delivery_id))[0].status == "bounced"


async def test_sweep_applies_parked_events_whose_id_became_known(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    delivered = ses_event("Delivery", message_id="sw-1")
    assert await ingestor.ses_message(delivered, event_id="s1") == ["parked"]
    made = await make_delivery(services, status="sent", attempts=[("accepted", "sw-1")])
    assert await ingestor.sweep_parked() == 1
    assert (await delivery_state(services, made.delivery_id))[0].status == "delivered"


@pytest.mark.parametrize("how", ["for_delivery", "sweep"])
async def test_callback_during_a_call_that_ends_unknown_settles_it_later(
    services: Services, ingestor: FeedbackIngestor, how: str
) -> None:
    made = await make_delivery(
        services, channel="sms", to=PHONE, status="sending", attempts=[("in_progress", None)]
    )
    params = status_params("SMw", "delivered", to=PHONE)
    query = {"d": str(made.delivery_id)}
    assert await ingestor.twilio_status(params, query=query, idempotency_token=None) == ["parked"]
    # The delivery is flagged, so the send path applies the parked event after its record.
    async with services.sessions() as session:
        flagged = await session.scalar(
            select(Delivery.parked_feedback).where(Delivery.id == made.delivery_id)
        )
    assert flagged is True
    # Nothing changes while the call is still in flight.
    assert await ingestor.sweep_parked() == 0
    # The call timed out: the send path records `unknown` without a provider id.
    async with services.sessions() as session:
        await session.execute(
            update(Attempt).where(Attempt.id == made.attempt_ids[0]).values(status="unknown")
        )
        await session.execute(
            update(Delivery).where(Delivery.id == made.delivery_id).values(status="unknown")
        )
        await session.commit()
    if how == "for_delivery":
        assert await ingestor.apply_parked_for_delivery(made.delivery_id) == 1
    else:
        assert await ingestor.sweep_parked() == 1
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (attempt.status, attempt.provider_message_id) == ("accepted", "SMw")
    assert delivery.status == "delivered"
    assert await ingestor.sweep_parked() == 0


async def test_keyed_callback_settles_an_unknown_attempt(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    settle_at = now() + dt.timedelta(minutes=5)
    made = await make_delivery(
        services,
        channel="sms",
        to=PHONE,
        status="unknown",
        attempts=[("unknown", None)],
        next_attempt_at=settle_at,
    )
    got = await ingestor.twilio_status(
        status_params("SMu", "sent", to=PHONE),
        query={"d": str(made.delivery_id)},
        idempotency_token=None,
    )
    assert got == ["applied"]
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (attempt.status, attempt.provider_message_id, attempt.provider_status) == (
        "accepted",
        "SMu",
        "sent",
    )
    assert (delivery.status, delivery.provider_message_id, delivery.next_attempt_at) == (
        "sent",
        "SMu",
        None,
    )


async def test_ses_tag_and_header_correlate_and_settle(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    by_tag = await make_delivery(services, status="unknown", attempts=[("unknown", None)])
    message = ses_event("Send", message_id="tag-1", delivery_ref=str(by_tag.delivery_id))
    assert await ingestor.ses_message(message, event_id="t1") == ["applied"]
    assert (await delivery_state(services, by_tag.delivery_id))[0].provider_message_id == "tag-1"

    by_header = await make_delivery(
        services, to="h@example.com", status="unknown", attempts=[("unknown", None)]
    )
    async with services.sessions() as session:
        derived = (await session.get(Delivery, by_header.delivery_id)).derived_key  # type: ignore[union-attr]
    message = ses_event("Delivery", message_id="hdr-1", recipients=("h@example.com",))
    message["mail"]["headers"].append({"name": "X-Gateway-Delivery", "value": derived})
    assert await ingestor.ses_message(message, event_id="t2") == ["applied"]
    delivery, (attempt,) = await delivery_state(services, by_header.delivery_id)
    assert (delivery.status, attempt.provider_message_id) == ("delivered", "hdr-1")


async def test_late_success_revives_a_dead_or_retrying_delivery(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    dead = await make_delivery(services, status="dead", attempts=[("accepted", "z-1")])
    assert await ingestor.ses_message(ses_event("Delivery", message_id="z-1"), event_id="z") == [
        "applied"
    ]
    assert (await delivery_state(services, dead.delivery_id))[0].status == "delivered"

    retrying = await make_delivery(
        services,
        to="r@example.com",
        status="retrying",
        attempts=[("accepted", "y-1"), ("transient", None)],
        next_attempt_at=now() + dt.timedelta(minutes=1),
    )
    late = ses_event("Send", message_id="y-1", recipients=("r@example.com",))
    assert await ingestor.ses_message(late, event_id="y") == ["applied"]
    delivery, attempts = await delivery_state(services, retrying.delivery_id)
    assert (delivery.status, delivery.next_attempt_at) == ("sent", None)
    assert [a.provider_status for a in attempts] == ["sent", None]


async def test_older_attempt_failure_does_not_move_the_delivery(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(
        services, status="sent", attempts=[("accepted", "old-1"), ("accepted", "new-1")]
    )
    assert await ingestor.ses_message(ses_event("Bounce", message_id="old-1"), event_id="b") == [
        "applied"
    ]
    delivery, attempts = await delivery_state(services, made.delivery_id)
    assert delivery.status == "sent"
    assert [a.provider_status for a in attempts] == ["bounced", None]
    assert [e.reason for e in await suppressions(services)] == ["hard_bounce"]


async def test_other_recipients_and_suppressed_deliveries_do_not_move(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, status="sent", attempts=[("accepted", "m-1")])
    stranger = ses_event("Delivery", message_id="m-1", recipients=("other@example.com",))
    assert await ingestor.ses_message(stranger, event_id="s") == ["ignored"]
    assert (await delivery_state(services, made.delivery_id))[0].status == "sent"

    frozen = await make_delivery(
        services, to="f@example.com", status="suppressed", attempts=[("accepted", "f-1")]
    )
    bounce = ses_event("Bounce", message_id="f-1", recipients=("f@example.com",))
    assert await ingestor.ses_message(bounce, event_id="f") == ["applied"]
    delivery, (attempt,) = await delivery_state(services, frozen.delivery_id)
    assert (delivery.status, attempt.provider_status) == ("suppressed", "bounced")


async def test_engagement_is_recorded_and_linked_but_moves_nothing(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, status="delivered", attempts=[("accepted", "e-1")])
    assert await ingestor.ses_message(ses_event("Open", message_id="e-1"), event_id="o") == [
        "ignored"
    ]
    assert await ingestor.ses_message(ses_event("Click", message_id="e-1"), event_id="c") == [
        "ignored"
    ]
    assert (await delivery_state(services, made.delivery_id))[0].status == "delivered"
    assert {(r.event_type, r.delivery_id) for r in await stored_events(services)} == {
        ("open", made.delivery_id),
        ("click", made.delivery_id),
    }


async def test_unknown_ses_types_are_stored_and_acknowledged(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    got = await ingestor.ses_message({"eventType": "Hologram", "mail": {}}, event_id="h")
    assert got == ["ignored"]
    (row,) = await stored_events(services)
    assert row.event_type == "unknown"


# ---- retries ----------------------------------------------------------------------------


async def test_transient_failure_schedules_a_bounded_feedback_retry(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMt")])
    before = now()
    got = await ingestor.twilio_status(
        status_params("SMt", "undelivered", to=PHONE, error_code="30003"),
        query={},
        idempotency_token=None,
    )
    assert got == ["applied"]
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (delivery.status, delivery.reason, attempt.provider_status, attempt.error_code) == (
        "retrying",
        "transient",
        "transient",
        "30003",
    )
    base = services.settings.retry.feedback_base_seconds
    assert delivery.next_attempt_at is not None
    # Feedback retries start at the feedback base (30 min by default), never sooner.
    assert delivery.next_attempt_at >= before + dt.timedelta(seconds=base)
    assert await suppressions(services) == []


async def test_exhausted_budget_or_deadline_dead_letters(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    max_attempts = services.settings.retry.max_attempts
    spent = await make_delivery(
        services,
        to="spent@example.com",
        attempts=[("accepted", f"b-{i}") for i in range(max_attempts)],
    )
    bounce = ses_event(
        "Bounce",
        message_id=f"b-{max_attempts - 1}",
        recipients=("spent@example.com",),
        bounce_type="Transient",
        bounce_subtype="MailboxFull",
        status="4.2.2",
    )
    assert await ingestor.ses_message(bounce, event_id="x") == ["applied"]
    late = await make_delivery(
        services,
        to="late@example.com",
        attempts=[("accepted", "l-1")],
        expires_at=now() + dt.timedelta(seconds=60),
    )
    bounce = ses_event(
        "Bounce",
        message_id="l-1",
        recipients=("late@example.com",),
        bounce_type="Undetermined",
        bounce_subtype="Undetermined",
        status=None,
    )
    assert await ingestor.ses_message(bounce, event_id="y") == ["applied"]
    async with services.sessions() as session:
        letters = {d.delivery_id: d.reason for d in await session.scalars(select(DeadLetter))}
    assert letters == {spent.delivery_id: "max_attempts", late.delivery_id: "expired"}
    for made in (spent, late):
        assert (await delivery_state(services, made.delivery_id))[0].status == "dead"


async def test_soft_bounces_reach_a_temporary_suppression_and_deliveries_reset(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    address = "soft@example.com"

    def soft(n: int) -> dict[str, object]:
        message = ses_event(
            "Bounce",
            message_id=f"soft-{n}",
            recipients=(address,),
            bounce_type="Transient",
            bounce_subtype="MailboxFull",
            status="4.2.2",
        )
        message["bounce"]["timestamp"] = (now() - dt.timedelta(minutes=10 - n)).isoformat()
        return message

    await ingestor.ses_message(soft(1), event_id="s1")
    await ingestor.ses_message(soft(2), event_id="s2")
    # A delivery to the address resets the count.
    delivered = ses_event("Delivery", message_id="ok-1", recipients=(address,))
    delivered["delivery"]["timestamp"] = (now() - dt.timedelta(minutes=7)).isoformat()
    await ingestor.ses_message(delivered, event_id="ok")
    await ingestor.ses_message(soft(4), event_id="s4")
    await ingestor.ses_message(soft(5), event_id="s5")
    assert await suppressions(services) == []
    await ingestor.ses_message(soft(6), event_id="s6")
    (entry,) = await suppressions(services)
    assert (entry.reason, entry.scope, entry.evidence["soft_bounces"]) == ("soft_bounce", "all", 3)
    window = services.settings.webhooks.soft_bounce_suppression_seconds
    assert entry.expires_at is not None
    assert abs((entry.expires_at - now()).total_seconds() - window) < 60
    # Once suppressed, more soft bounces do not pile up entries or history.
    await ingestor.ses_message(soft(7), event_id="s7")
    assert [h.action for h in await history(services)] == ["add"]


# ---- Twilio -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("21610", "failed", "sms_stop"),
        ("21211", "failed", "invalid_address"),
        ("30005", "failed", "invalid_address"),
        ("30007", "failed", None),
    ],
)
async def test_twilio_permanent_codes(
    services: Services, ingestor: FeedbackIngestor, code: str, status: str, reason: str | None
) -> None:
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMk")])
    params = status_params("SMk", "undelivered", to=PHONE, error_code=code)
    assert await ingestor.twilio_status(params, query={}, idempotency_token=None) == ["applied"]
    assert (await delivery_state(services, made.delivery_id))[0].status == status
    assert [e.reason for e in await suppressions(services)] == ([reason] if reason else [])


async def test_account_codes_flag_the_provider(services: Services) -> None:
    flagged: list[tuple[str, str]] = []

    async def hook(provider: str, rule: str) -> None:
        flagged.append((provider, rule))

    ingestor = FeedbackIngestor(
        services.engine,
        services.protector,
        services.settings.webhooks,
        retry=services.settings.retry,
        on_account_problem=hook,
    )
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMa")])
    before = value(PROVIDER_FLAGS, provider="twilio", rule="twilio:30034")
    params = status_params("SMa", "failed", to=PHONE, error_code="30034")
    assert await ingestor.twilio_status(params, query={}, idempotency_token=None) == ["applied"]
    assert flagged == [("twilio", "twilio:30034")]
    assert value(PROVIDER_FLAGS, provider="twilio", rule="twilio:30034") == before + 1
    # DESIGN "Classify, don't guess": an account-level code neither suppresses the recipient
    # nor fails the message; the delivery waits out the account cool-down (not the feedback
    # backoff of a handset that is off), bounded by its deadline and the deferral age.
    # Like an account-level answer at send time: `queued`, so the worker does not hold it to
    # the attempt budget, and the deferral clock (GATEWAY_RETRY_MAX_DEFERRAL_SECONDS) runs.
    delivery, (attempt,) = await delivery_state(services, made.delivery_id)
    assert (delivery.status, delivery.reason, attempt.provider_status) == (
        "queued",
        "account",
        "transient",
    )
    assert delivery.deferred_since is not None and delivery.attempts == 1
    cooldown = services.settings.retry.breaker_account_cooldown_seconds
    assert delivery.next_attempt_at is not None
    assert delivery.next_attempt_at >= now() + dt.timedelta(seconds=cooldown - 5)
    assert await suppressions(services) == []


async def test_recipient_codes_retry_then_fail_without_a_dead_letter(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    # Twilio 21612 in a callback means what it means at send time: this recipient is not
    # reachable from this sender; retried within the budget, then failed (not dead).
    made = await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMr")])
    params = status_params("SMr", "undelivered", to=PHONE, error_code="21612")
    assert await ingestor.twilio_status(params, query={}, idempotency_token=None) == ["applied"]
    delivery, _ = await delivery_state(services, made.delivery_id)
    assert (delivery.status, delivery.reason) == ("retrying", "recipient")
    spent = FeedbackIngestor(
        services.engine,
        services.protector,
        services.settings.webhooks,
        retry=dataclasses.replace(services.settings.retry, max_attempts=1),
    )
    made = await make_delivery(services, channel="sms", to=PHONE2, attempts=[("accepted", "SMs")])
    params = status_params("SMs", "undelivered", to=PHONE2, error_code="21612")
    assert await spent.twilio_status(params, query={}, idempotency_token=None) == ["applied"]
    delivery, _ = await delivery_state(services, made.delivery_id)
    assert (delivery.status, delivery.reason) == ("failed", "recipient")
    assert await suppressions(services) == []


async def test_account_codes_open_the_wired_breaker(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    breaker = services.breaker
    await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMb")])
    params = status_params("SMb", "failed", to=PHONE, error_code="30002")
    await ingestor.twilio_status(params, query={}, idempotency_token=None)
    assert await breaker.state("twilio") == "open"


async def test_inbound_stop_start_help(services: Services, ingestor: FeedbackIngestor) -> None:
    base = twilio_form("va-inbound-sms.form.txt")
    sender = base["From"]
    sender_hash = hash_of(services, "sms", sender)

    stop = {**base, "Body": " stop ", "MessageSid": "SMin1"}
    assert await ingestor.twilio_inbound(stop, idempotency_token=None) == ["applied"]
    (entry,) = await suppressions(services)
    assert (entry.channel, entry.address_hash, entry.reason, entry.scope) == (
        "sms",
        sender_hash,
        "sms_stop",
        "all",
    )
    assert entry.evidence["message_sid"] == "SMin1" and entry.evidence["keyword"] == "STOP"
    assert "at" in entry.evidence

    helpme = {**base, "Body": "HELP", "MessageSid": "SMin2"}
    assert await ingestor.twilio_inbound(helpme, idempotency_token=None) == ["ignored"]
    plain = {**base, "MessageSid": "SMin3"}
    assert await ingestor.twilio_inbound(plain, idempotency_token=None) == ["ignored"]

    start = {**base, "Body": "unstop", "MessageSid": "SMin4"}
    assert await ingestor.twilio_inbound(start, idempotency_token=None) == ["applied"]
    assert await suppressions(services) == []
    actions = [(h.action, h.reason) for h in await history(services)]
    assert actions == [("add", "sms_stop"), ("remove", "sms_stop")]

    opt_out = {**base, "Body": "ARRET", "OptOutType": "STOP", "MessageSid": "SMin5"}
    assert await ingestor.twilio_inbound(opt_out, idempotency_token=None) == ["applied"]
    async with services.sessions() as session:
        hit = await service.check(session, "sms", sender_hash)
    assert hit is not None and hit.reason == "sms_stop"
    # A START only lifts STOP: other suppressions of the number stay.
    async with services.sessions() as session:
        await service.add(
            session,
            services.protector,
            normalize("sms", sender),
            reason="unsubscribe",
            scope="marketing",
            source=service.Source("manual"),
        )
        await session.commit()
    restart = {**base, "Body": "START", "MessageSid": "SMin6"}
    await ingestor.twilio_inbound(restart, idempotency_token=None)
    assert [e.reason for e in await suppressions(services)] == ["unsubscribe"]


async def test_subscription_events_suppress_topics(
    services: Services, ingestor: FeedbackIngestor
) -> None:
    message = ses_payload("awsdocs-event-subscription.json")
    assert await ingestor.ses_message(message, event_id="sub") == ["applied"]
    scopes = sorted((e.reason, e.scope) for e in await suppressions(services))
    assert scopes == [("unsubscribe", "ExampleTopicName"), ("unsubscribe", "marketing")]
    recipient = hash_of(services, "email", "recipient@example.com")
    async with services.sessions() as session:
        assert await service.check(session, "email", recipient, category="transactional") is None
        hit = await service.check(
            session, "email", recipient, category="marketing", topic="ExampleTopicName"
        )
        assert hit is not None and hit.reason == "unsubscribe"


async def test_rows_record_unique_event_ids(services: Services, ingestor: FeedbackIngestor) -> None:
    # Same Twilio message, different statuses without tokens: different events.
    await make_delivery(services, channel="sms", to=PHONE, attempts=[("accepted", "SMx")])
    for status in ("queued", "sent", "delivered", "delivered"):
        await ingestor.twilio_status(
            status_params("SMx", status, to=PHONE), query={}, idempotency_token=None
        )
    rows = await stored_events(services)
    assert [r.event_type for r in rows] == ["queued", "sent", "delivered"]
    assert [r.disposition for r in rows] == ["applied", "duplicate", "applied"]
    assert len({r.provider_event_id for r in rows}) == 3
    assert all(isinstance(r.id, uuid.UUID) for r in rows)
