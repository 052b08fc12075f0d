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

Each accepted message becomes a `SandboxRecord` (what the provider saw, and the callbacks it
would make, planned with fixed event ids and due times). The `FeedbackRunner` delivers the
callbacks in background tasks, `delay` seconds apart, and hands records and callback progress
to an injected `MailboxStore` (the composition root passes `sender.mailbox`'s, which writes
the `sandbox_messages` table): that is the sandbox mailbox (`GET /v1/sandbox/messages`), and
it lets a restarted process replay callbacks that were still pending. `drain()` waits for
all of them (tests use it to await pending feedback deterministically).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.policy
import email.utils
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
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


@dataclass
class SimulatedCallback:
    """One callback the real provider would make, planned at send time.

    `event_id` is fixed when it is planned (SES: the SNS MessageId of the notification that
    would carry it; Twilio: the `I-Twilio-Idempotency-Token`), so delivering it again after
    a restart is a duplicate to the event store, not a second event.
    """

    seq: int
    kind: str  # "ses" | "twilio"
    event: str  # SES eventType ("Send", "Bounce", ...) or Twilio MessageStatus
    due_at: dt.datetime
    payload: dict[str, Any]  # SES: the event JSON; Twilio: the form parameters
    event_id: str
    query: dict[str, str] = field(default_factory=dict)  # Twilio: the callback URL's query
    delivered_at: dt.datetime | None = None
    # What the feedback path made of it (its dispositions), or "error: <type>".
    result: str | None = None

    async def deliver(self, feedback: Feedback) -> str:
        """Hand it to the feedback path; its answer as text."""
        if self.kind == "ses":
            answer = await feedback.ses_message(self.payload, event_id=self.event_id)
        else:
            answer = await feedback.twilio_status(
                self.payload, query=self.query, idempotency_token=self.event_id
            )
        if isinstance(answer, list | tuple):
            return ",".join(str(a) for a in answer)
        return "" if answer is None else str(answer)


@dataclass
class SandboxRecord:
    """One message a sandbox provider accepted: what the provider saw, and its callbacks.

    `content` for email: `from`, `to`, `reply_to`, `subject`, `text`, `html`, `headers`
    (`[[name, value], ...]` as sent, the correlation header included), `tags`; for SMS:
    `from`, `to`, `body`, `messaging_service_sid`, `status_callback`.
    """

    id: uuid.UUID
    channel: str
    provider: str
    provider_message_id: str
    delivery_id: uuid.UUID
    to: str
    created_at: dt.datetime
    content: dict[str, Any]
    callbacks: list[SimulatedCallback]

    @property
    def next_callback_at(self) -> dt.datetime | None:
        """Due time of the first callback not delivered yet (None when all were)."""
        return next((c.due_at for c in self.callbacks if c.delivered_at is None), None)


class MailboxStore(Protocol):
    """Persistence of sandbox records, handed in by the composition root (provider code never
    touches the database itself; `sender.mailbox` implements it)."""

    async def write(
        self, new: Sequence[SandboxRecord], progressed: Sequence[SandboxRecord]
    ) -> None:
        """Insert `new` records and store the callback progress of `progressed` ones."""
        ...

    async def pending(self) -> list[SandboxRecord]:
        """Every stored record with callbacks not delivered yet."""
        ...


class FeedbackRunner:
    """Runs simulated callbacks in background tasks, a configurable moment after each send,
    and records what the sandbox accepted in the mailbox store (when there is one).

    Records are written in batches by one background writer, off the send path: a send
    adds no database round trip of its own; each write is one statement for every record
    accepted (and every callback delivered) since the previous one. A callback that was
    delivered but whose progress was not written yet when the process died is delivered
    again by `replay` and stored by the event store as a duplicate.
    """

    CONCURRENCY = 4
    # Callbacks that are due but wait for the gate above: from this many on, sandbox sends
    # wait (`room`) until the backlog drains. A real provider's callbacks arrive as requests
    # that compete with the sends; without this bound, sends faster than their callbacks can
    # be applied grew the backlog, and the process's memory, without limit (3.3x the RSS
    # after 100,000 sends).
    MAX_OVERDUE = 256
    # Pause before writing again after the store failed (database away).
    RETRY_SECONDS = 1.0
    # The writer waits this long before a round, so the records of the sends in between go in
    # one statement: at one send at a time each send would otherwise cost the database a
    # statement of its own. The mailbox API flushes before it reads, so nobody sees the lag.
    COALESCE_SECONDS = 0.05

    def __init__(
        self,
        feedback: Feedback | None = None,
        *,
        delay: float = 0.2,
        store: MailboxStore | None = None,
    ) -> None:
        self.feedback = feedback
        self.delay = delay
        self.store = store
        self._tasks: set[asyncio.Task[None]] = set()
        # Records being delivered by this process (replay skips them).
        self._live: set[uuid.UUID] = set()
        # Simulated callbacks applied at the same time: under a burst of sends they wait
        # here instead of taking every pooled database connection from the sends.
        self._gate = asyncio.Semaphore(self.CONCURRENCY)
        self._overdue = 0
        self._room = asyncio.Event()
        self._room.set()
        self._unwritten: dict[uuid.UUID, SandboxRecord] = {}
        self._progressed: dict[uuid.UUID, SandboxRecord] = {}
        self._writer: asyncio.Task[None] | None = None

    def due_times(self, start: dt.datetime, n: int) -> list[dt.datetime]:
        """When each of `n` callbacks of a send made at `start` is due."""
        return [start + dt.timedelta(seconds=self.delay * (i + 1)) for i in range(n)]

    def submit(self, record: SandboxRecord) -> None:
        """Record `record` in the mailbox and deliver its callbacks in order, each when due."""
        if self.store is not None:
            self._unwritten[record.id] = record
            self._wake_writer()
        if self.feedback is not None and record.callbacks:
            self._start(self.feedback, record)

    async def replay(self) -> int:
        """Schedule the stored callbacks not delivered yet (a process that died, or stopped
        with callbacks pending, left them); past-due ones run at once. How many records."""
        if self.store is None or self.feedback is None:
            return 0
        n = 0
        for record in await self.store.pending():
            if record.id not in self._live:
                self._start(self.feedback, record)
                n += 1
        if n:
            log.info("sandbox: replaying the pending callbacks of %d message(s)", n)
        return n

    def _start(self, feedback: Feedback, record: SandboxRecord) -> None:
        self._live.add(record.id)
        task = asyncio.get_running_loop().create_task(self._run(feedback, record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._live.discard(record.id))

    async def _run(self, feedback: Feedback, record: SandboxRecord) -> None:
        for callback in record.callbacks:
            if callback.delivered_at is not None:
                continue
            wait = (callback.due_at - dt.datetime.now(dt.UTC)).total_seconds()
            await asyncio.sleep(max(0.0, wait))
            try:
                await self._acquire_gate()
                try:
                    callback.result = await callback.deliver(feedback)
                finally:
                    self._gate.release()
            except Exception as exc:
                log.exception("sandbox feedback failed")
                callback.result = f"error: {type(exc).__name__}"
            callback.delivered_at = dt.datetime.now(dt.UTC)
            self._progress(record)

    async def _acquire_gate(self) -> None:
        """Wait for the gate, counted in the overdue backlog meanwhile."""
        self._overdue += 1
        if self._overdue >= self.MAX_OVERDUE:
            self._room.clear()
        try:
            await self._gate.acquire()
        finally:
            self._overdue -= 1
            if self._overdue < self.MAX_OVERDUE:
                self._room.set()

    async def room(self) -> None:
        """Wait while the overdue backlog is full (a sandbox send calls this before it
        accepts a message): the sends slow down to the pace their callbacks are applied."""
        await self._room.wait()

    @property
    def overdue(self) -> int:
        """Callbacks due and waiting to be applied."""
        return self._overdue

    def _progress(self, record: SandboxRecord) -> None:
        if self.store is None:
            return
        if record.id not in self._unwritten:
            # (Not written yet: the insert carries the progress.)
            self._progressed[record.id] = record
        self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_all())

    async def _write_all(self) -> None:
        """Write until nothing is left (one statement per round); retry while the store
        fails."""
        assert self.store is not None
        await asyncio.sleep(self.COALESCE_SECONDS)
        while self._unwritten or self._progressed:
            new = list(self._unwritten.values())
            progressed = list(self._progressed.values())
            self._unwritten.clear()
            self._progressed.clear()
            try:
                await self.store.write(new, progressed)
            except Exception:
                log.exception("sandbox mailbox: writing %d record(s) failed", len(new))
                for record in new:
                    self._unwritten.setdefault(record.id, record)
                    self._progressed.pop(record.id, None)
                for record in progressed:
                    if record.id not in self._unwritten:
                        self._progressed.setdefault(record.id, record)
                await asyncio.sleep(self.RETRY_SECONDS)

    async def flush(self) -> None:
        """Wait until every record and progress so far is written (no-op without a store)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    @property
    def pending(self) -> int:
        """Number of messages whose callbacks are not all delivered yet."""
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every submitted callback (including new ones) has run and is written."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.flush()

    async def close(self) -> None:
        """Cancel the callbacks still pending (stored ones are replayed at the next start)
        and write what is not written yet."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if self._writer is not None and not self._writer.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), timeout=10)
            except Exception:
                log.exception("sandbox mailbox: records not written at shutdown")
                self._writer.cancel()


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
        await self.runner.room()
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
        due = self.runner.due_times(now, len(events))
        record = SandboxRecord(
            id=uuid.uuid4(),
            channel=self.channel,
            provider=self.name,
            provider_message_id=message_id,
            delivery_id=message.delivery_id,
            to=message.to,
            created_at=now,
            content=self._content(message, mail),
            callbacks=[
                # The SNS MessageId of the notification that would have carried the event.
                SimulatedCallback(i, "ses", event["eventType"], due[i], event, str(uuid.uuid4()))
                for i, event in enumerate(events)
            ],
        )
        self.runner.submit(record)
        return SendOutcome(self.name, provider_message_id=message_id)

    def _content(self, message: OutgoingMessage, mail: dict[str, Any]) -> dict[str, Any]:
        # What the mailbox shows and renders as MIME: the message as SES would have built it.
        return {
            "from": mail["source"],
            "to": message.to,
            "reply_to": list(message.reply_to),
            "subject": message.subject or "",
            "text": message.text,
            "html": message.html,
            "headers": [[h["name"], h["value"]] for h in mail["headers"]],
            "tags": mail["tags"],
        }

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
        await self.runner.room()
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
        callback_url = status_callback_url(self._public_url, message.delivery_id)
        query = dict(parse_qsl(urlsplit(callback_url).query))
        now = dt.datetime.now(dt.UTC)
        statuses = ("sent", "delivered")
        due = self.runner.due_times(now, len(statuses))
        record = SandboxRecord(
            id=uuid.uuid4(),
            channel=self.channel,
            provider=self.name,
            provider_message_id=sid,
            delivery_id=message.delivery_id,
            to=message.to,
            created_at=now,
            content={
                "from": from_,
                "to": message.to,
                "body": message.body or "",
                "messaging_service_sid": base.get("MessagingServiceSid"),
                "status_callback": callback_url,
            },
            callbacks=[
                SimulatedCallback(
                    i,
                    "twilio",
                    status,
                    due[i],
                    {**base, "MessageStatus": status, "SmsStatus": status},
                    # Twilio's `I-Twilio-Idempotency-Token`, constant across its own retries.
                    f"{sid}-{status}",
                    query,
                )
                for i, status in enumerate(statuses)
            ],
        )
        self.runner.submit(record)
        return SendOutcome(self.name, provider_message_id=sid)

    async def close(self) -> None:
        """Cancel pending feedback."""
        await self.runner.close()


# Long header values (a List-Unsubscribe URL with its token) stay on one line: RFC 5322
# allows 998 characters, and folding them would only make the link harder to copy.
_MIME_POLICY = email.policy.SMTP.clone(max_line_length=998)


def render_mime(record: SandboxRecord) -> bytes:
    """The email as SES would have put it on the wire (`.eml`): headers, then text/html."""
    content = record.content
    mime = EmailMessage(policy=_MIME_POLICY)

    def put(name: str, value: object) -> None:
        text = " ".join(str(value).splitlines())
        if text:
            mime[name] = text

    put("From", content.get("from") or "")
    put("To", content.get("to") or record.to)
    if content.get("reply_to"):
        put("Reply-To", ", ".join(content["reply_to"]))
    put("Subject", content.get("subject") or "")
    put("Date", email.utils.format_datetime(record.created_at))
    # SES's own Message-ID form (the SES message id at its mail domain).
    put("Message-ID", f"<{record.provider_message_id}@email.amazonses.com>")
    taken = {"from", "to", "subject", "mime-version", "reply-to", "date", "message-id"}
    for name, value in content.get("headers") or []:
        if str(name).lower() not in taken:
            put(str(name), value)
    text, html = content.get("text"), content.get("html")
    if text is not None or html is None:
        mime.set_content(text or "")
        if html is not None:
            mime.add_alternative(html, subtype="html")
    else:
        mime.set_content(html, subtype="html")
    return mime.as_bytes()
