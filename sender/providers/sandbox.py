"""Sandbox providers: the embedded default, with no provider account and no network.

They behave like SES's mailbox simulator and Twilio's magic test numbers, and a moment after
accepting a message they produce the callbacks the real provider would, in the real
payload shapes, handed to an injected `Feedback` object (the composition root passes the
webhooks' parse-and-apply path; signature verification is the only step skipped).

Email (`<kind>[+label]@simulator.amazonses.com`): `success` -> Send, Delivery; `bounce` ->
Send, Bounce Permanent/General; `ooto` -> Send, Delivery (the auto-reply goes to the sender);
`complaint` -> Send, Delivery, Complaint (abuse); `suppressionlist` -> Send, Bounce
Permanent/Suppressed. Any other address: Send, Delivery.

SMS: To `+15005550001` -> error 21211, `+15005550002` -> 21612, `+15005550003` -> 21408,
`+15005550004` -> 21610, `+15005550009` -> 21614; From `+15005550001` -> 21212,
`+15005550007` -> 21606, `+15005550008` -> 21611. `+15005550006` and any other number:
accepted, then status callbacks `sent` and `delivered`.

Feedback runs in background tasks after `delay` seconds per event; `drain()` waits for all of
them (tests use it to await pending feedback deterministically).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from sender.classify import SendOutcome
from sender.providers.base import OutgoingMessage
from sender.providers.twilio import status_callback_url

log = logging.getLogger("gateway.sender.sandbox")

SIMULATOR_DOMAIN = "simulator.amazonses.com"
SANDBOX_ACCOUNT_ID = "000000000000"
SANDBOX_ACCOUNT_SID = "AC" + "0" * 32
MAGIC_FROM = "+15005550006"

# Twilio test-credential magic numbers (PROVIDERS.md section 4): To -> (code, message).
MAGIC_TO: dict[str, tuple[int, str]] = {
    "+15005550001": (21211, "The 'To' number {to} is not a valid phone number."),
    "+15005550002": (21612, "The 'To' phone number is not currently reachable via SMS."),
    "+15005550003": (
        21408,
        "Permission to send an SMS has not been enabled for the region "
        "indicated by the 'To' number: {to}.",
    ),
    "+15005550004": (21610, "Attempt to send to unsubscribed recipient"),
    "+15005550009": (21614, "'To' number is not a valid mobile number"),
}
MAGIC_FROM_ERRORS: dict[str, tuple[int, str]] = {
    "+15005550001": (21212, "The 'From' number {from_} is not a valid phone number."),
    "+15005550007": (
        21606,
        "The 'From' phone number provided is not a valid message-capable "
        "phone number for this account.",
    ),
    "+15005550008": (
        21611,
        "This 'From' number has exceeded the maximum number of queued messages.",
    ),
}


class Feedback(Protocol):
    """Where sandbox callbacks go: the webhooks' parse-and-apply path, minus signatures."""

    async def ses_message(self, message: dict[str, Any], *, event_id: str) -> object:
        """One SES event (the JSON that SES puts in the SNS `Message`)."""
        ...

    async def twilio_status(
        self,
        params: Mapping[str, str],
        *,
        query: Mapping[str, str],
        idempotency_token: str | None,
    ) -> object:
        """One Twilio status callback (form parameters and the callback URL's query)."""
        ...


class FeedbackRunner:
    """Runs feedback in background tasks, a configurable moment after each send."""

    CONCURRENCY = 4

    def __init__(self, feedback: Feedback | None = None, *, delay: float = 0.2) -> None:
        self.feedback = feedback
        self.delay = delay
        self._tasks: set[asyncio.Task[None]] = set()
        # Simulated callbacks applied at the same time: under a burst of sends they wait
        # here instead of taking every pooled database connection from the sends.
        self._gate = asyncio.Semaphore(self.CONCURRENCY)

    def submit(self, events: list[Callable[[Feedback], Awaitable[object]]]) -> None:
        """Deliver `events` in order, each `delay` seconds after the previous one."""
        if self.feedback is None or not events:
            return
        task = asyncio.get_running_loop().create_task(self._run(self.feedback, events))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, feedback: Feedback, events: list[Callable[[Feedback], Awaitable[object]]]
    ) -> None:
        for event in events:
            await asyncio.sleep(self.delay)
            try:
                async with self._gate:
                    await event(feedback)
            except Exception:
                log.exception("sandbox feedback failed")

    @property
    def pending(self) -> int:
        """Number of feedback sequences not finished yet."""
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every submitted feedback sequence (including new ones) has run."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel whatever is still pending."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _iso(moment: dt.datetime) -> str:
    return (
        moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{moment.microsecond // 1000:03d}Z"
    )


def ses_message_id(now: dt.datetime | None = None) -> str:
    """An id shaped like SES's (`<16 hex>-<uuid>-000000`)."""
    now = now or dt.datetime.now(dt.UTC)
    millis = int(now.timestamp() * 1000)
    return f"{millis:016x}-{uuid.uuid4()}-000000"


class SandboxEmailProvider:
    """SES mailbox simulator look-alike."""

    name = "ses"
    channel = "email"

    def __init__(self, runner: FeedbackRunner, *, configuration_set: str | None = None) -> None:
        self.runner = runner
        self._configuration_set = configuration_set or "sandbox"

    def limiter_key(self, message: OutgoingMessage) -> str:
        """Same bucket as SES."""
        return "ses"

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """Accept the message and schedule the events the simulator would publish."""
        now = dt.datetime.now(dt.UTC)
        message_id = ses_message_id(now)
        mail = self._mail(message, message_id, now)
        local, _, domain = message.to.rpartition("@")
        kind = local.split("+", 1)[0].lower() if domain.lower() == SIMULATOR_DOMAIN else "other"
        events: list[dict[str, Any]] = [{"eventType": "Send", "mail": mail, "send": {}}]
        if kind in ("bounce", "suppressionlist"):
            events.append(
                {"eventType": "Bounce", "mail": mail, "bounce": self._bounce(message, kind)}
            )
        else:
            events.append(
                {"eventType": "Delivery", "mail": mail, "delivery": self._delivery(message)}
            )
        if kind == "complaint":
            events.append(
                {"eventType": "Complaint", "mail": mail, "complaint": self._complaint(message)}
            )
        self.runner.submit([_ses_event(event) for event in events])
        return SendOutcome(self.name, provider_message_id=message_id)

    def _mail(self, message: OutgoingMessage, message_id: str, now: dt.datetime) -> dict[str, Any]:
        source = message.sender or "gateway@example.com"
        domain = source.rpartition("@")[2]
        headers = [
            {"name": "From", "value": source},
            {"name": "To", "value": message.to},
            {"name": "Subject", "value": message.subject or ""},
            {"name": "MIME-Version", "value": "1.0"},
            *({"name": name, "value": value} for name, value in message.headers),
            {"name": "X-Gateway-Delivery", "value": message.derived_key},
        ]
        tags = {
            "ses:operation": ["SendEmail"],
            "ses:configuration-set": [self._configuration_set],
            "ses:source-ip": ["192.0.2.0"],
            "ses:from-domain": [domain],
            "ses:caller-identity": ["sandbox"],
            "delivery_id": [str(message.delivery_id)],
            "derived_key": [message.derived_key],
            **{k: [v] for k, v in message.extra_tags.items()},
        }
        return {
            "timestamp": _iso(now),
            "source": source,
            "sourceArn": f"arn:aws:ses:us-east-1:{SANDBOX_ACCOUNT_ID}:identity/{domain}",
            "sendingAccountId": SANDBOX_ACCOUNT_ID,
            "messageId": message_id,
            "destination": [message.to],
            "headersTruncated": False,
            "headers": headers,
            "commonHeaders": {
                "from": [source],
                "to": [message.to],
                "messageId": message_id,
                "subject": message.subject or "",
            },
            "tags": tags,
        }

    def _delivery(self, message: OutgoingMessage) -> dict[str, Any]:
        return {
            "timestamp": _iso(dt.datetime.now(dt.UTC)),
            "processingTimeMillis": 812,
            "recipients": [message.to],
            "smtpResponse": "250 2.6.0 Message received",
            "reportingMTA": "a8-70.smtp-out.amazonses.com",
        }

    def _bounce(self, message: OutgoingMessage, kind: str) -> dict[str, Any]:
        if kind == "suppressionlist":
            subtype = "Suppressed"
            diagnostic = (
                "Amazon SES has suppressed sending to this address because it has a recent "
                "history of bouncing as an invalid address."
            )
            mta = "dns; amazonses.com"
        else:
            subtype = "General"
            diagnostic = "smtp; 550 5.1.1 user unknown"
            mta = "dns; a48-30.smtp-out.amazonses.com"
        return {
            "feedbackId": ses_message_id(),
            "bounceType": "Permanent",
            "bounceSubType": subtype,
            "bouncedRecipients": [
                {
                    "emailAddress": message.to,
                    "action": "failed",
                    "status": "5.1.1",
                    "diagnosticCode": diagnostic,
                }
            ],
            "timestamp": _iso(dt.datetime.now(dt.UTC)),
            "reportingMTA": mta,
        }

    def _complaint(self, message: OutgoingMessage) -> dict[str, Any]:
        now = _iso(dt.datetime.now(dt.UTC))
        return {
            "feedbackId": ses_message_id(),
            "complaintSubType": None,
            "complainedRecipients": [{"emailAddress": message.to}],
            "timestamp": now,
            "userAgent": "Amazon SES Mailbox Simulator",
            "complaintFeedbackType": "abuse",
            "arrivalDate": now,
        }

    async def close(self) -> None:
        """Cancel pending feedback."""
        await self.runner.close()


def _ses_event(event: dict[str, Any]) -> Callable[[Feedback], Awaitable[object]]:
    async def deliver(feedback: Feedback) -> object:
        # The SNS MessageId of the notification that would have carried this event.
        return await feedback.ses_message(event, event_id=str(uuid.uuid4()))

    return deliver


class SandboxSmsProvider:
    """Twilio magic-number look-alike."""

    name = "twilio"
    channel = "sms"

    def __init__(
        self,
        runner: FeedbackRunner,
        *,
        public_url: str,
        sms_from: str | None = None,
        messaging_service_sid: str | None = None,
    ) -> None:
        self.runner = runner
        self._public_url = public_url
        self._from = sms_from
        self._service = messaging_service_sid

    def limiter_key(self, message: OutgoingMessage) -> str:
        """Same bucket naming as Twilio."""
        return f"twilio:{message.sender or self._from or self._service or MAGIC_FROM}"

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """Answer like Twilio's test credentials, then post the status callbacks."""
        from_ = message.sender or self._from or (None if self._service else MAGIC_FROM)
        error = MAGIC_FROM_ERRORS.get(from_ or "") or MAGIC_TO.get(message.to)
        if error is not None:
            code, text = error
            return SendOutcome(
                self.name,
                error_code=str(code),
                http_status=400,
                message=text.format(to=message.to, from_=from_),
            )
        sid = "SM" + secrets.token_hex(16)
        base = {
            "MessageSid": sid,
            "SmsSid": sid,
            "AccountSid": SANDBOX_ACCOUNT_SID,
            "From": from_ or "",
            "To": message.to,
            "ApiVersion": "2010-04-01",
        }
        if self._service and not from_:
            base["MessagingServiceSid"] = self._service
        # The real callback URL is status_callback_url(...); its query carries the delivery id.
        query = dict(
            parse_qsl(urlsplit(status_callback_url(self._public_url, message.delivery_id)).query)
        )
        events = [
            _twilio_event({**base, "MessageStatus": status, "SmsStatus": status}, query)
            for status in ("sent", "delivered")
        ]
        self.runner.submit(events)
        return SendOutcome(self.name, provider_message_id=sid)

    async def close(self) -> None:
        """Cancel pending feedback."""
        await self.runner.close()


def _twilio_event(
    params: dict[str, str], query: dict[str, str]
) -> Callable[[Feedback], Awaitable[object]]:
    async def deliver(feedback: Feedback) -> object:
        # Twilio sends `I-Twilio-Idempotency-Token`, constant across its own retries.
        token = f"{params['MessageSid']}-{params['MessageStatus']}"
        return await feedback.twilio_status(params, query=query, idempotency_token=token)

    return deliver
