"""HTTP routes of the sandbox mailbox (scope `read`): what the sandbox providers accepted.

`GET /v1/sandbox/messages` lists messages newest first (`to`, `channel`, `limit`, `cursor`);
`GET /v1/sandbox/messages/{id}` shows one with its headers and tags, its content, the
one-click unsubscribe link of marketing email and the simulated callbacks that followed;
`?format=eml` downloads an email as the MIME message SES would have sent (`message/rfc822`).
With real providers for every channel (no sandbox), every route answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
from litestar import Controller, Response, get
from litestar.datastructures import State
from litestar.di import Provide
from litestar.exceptions import ClientException, HTTPException, NotFoundException
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter, QueryParameter

from sender.mailbox import BadCursor, Filter, Mailbox
from sender.providers.sandbox import FeedbackRunner, SandboxRecord, render_mime

# The correlation header the sandbox (like the SES adapter) adds to every email.
DERIVED_KEY_HEADER = "X-Gateway-Delivery"
# How long a listing waits for this process's not-yet-written records (read your writes).
FLUSH_WAIT_SECONDS = 2.0


@dataclass(frozen=True)
class MailboxContext:
    """What the mailbox routes need from the composition root (None there: no sandbox)."""

    mailbox: Mailbox
    runner: FeedbackRunner
    # Channels whose provider is the sandbox.
    channels: tuple[str, ...]


class SandboxCallback(msgspec.Struct, kw_only=True):
    """A simulated provider callback: when it was due, when it was handed to the feedback
    path and what that made of it (the event store's disposition, e.g. `applied`)."""

    seq: int
    event: str
    due_at: dt.datetime
    delivered_at: dt.datetime | None
    result: str | None
    # The SES event JSON or the Twilio status callback's form parameters.
    payload: dict[str, Any] | None = None


class SandboxHeader(msgspec.Struct):
    """One email header as sent."""

    name: str
    value: str


class SandboxMessageSummary(msgspec.Struct, kw_only=True):
    """A message as listed."""

    id: uuid.UUID
    channel: str
    provider: str
    provider_message_id: str
    delivery_id: uuid.UUID
    to: str
    from_: str | None = msgspec.field(name="from")
    subject: str | None = None
    body: str | None = None
    created_at: dt.datetime
    # The last simulated callback delivered so far (e.g. `Delivery`, `Bounce`, `delivered`).
    last_event: str | None
    callbacks_pending: int


class SandboxMessagePage(msgspec.Struct, kw_only=True):
    """A page of messages, newest first; pass `next_cursor` as `cursor` for the next one."""

    items: list[SandboxMessageSummary]
    next_cursor: str | None


class SandboxMessageDetail(SandboxMessageSummary, kw_only=True):
    """One message with everything the provider saw and the callbacks that followed."""

    # Email: every header as sent, in order, and the SES message tags.
    headers: list[SandboxHeader] | None = None
    tags: dict[str, list[str]] | None = None
    list_unsubscribe: str | None = None
    list_unsubscribe_post: str | None = None
    # The RFC 8058 one-click URL from List-Unsubscribe: POST `List-Unsubscribe=One-Click`.
    unsubscribe_url: str | None = None
    # The derived idempotency key, as carried by the X-Gateway-Delivery header.
    derived_key: str | None = None
    reply_to: list[str] | None = None
    text: str | None = None
    html: str | None = None
    # Where the rendered MIME message can be downloaded (email only).
    eml_url: str | None = None
    # SMS: the Messaging Service used and the status-callback URL Twilio would call.
    messaging_service_sid: str | None = None
    status_callback: str | None = None
    callbacks: list[SandboxCallback]


def provide_mailbox(state: State) -> MailboxContext:
    """The mailbox the composition root wired, or 404 when no provider is the sandbox."""
    context: MailboxContext | None = state.services.sandbox_mailbox
    if context is None:
        raise HTTPException(
            status_code=404,
            detail="The sandbox mailbox exists only while a sandbox provider is configured "
            "(GATEWAY_EMAIL_PROVIDER / GATEWAY_SMS_PROVIDER = sandbox).",
            extra={"type": "urn:problem:sandbox-not-configured"},
        )
    return context


def _header(record: SandboxRecord, name: str) -> str | None:
    for key, value in record.content.get("headers") or []:
        if str(key).lower() == name.lower():
            return str(value)
    return None


_HTTPS_TARGET = re.compile(r"<(https://[^>]+|http://[^>]+)>")


def summary(record: SandboxRecord) -> SandboxMessageSummary:
    """The listed view of a record."""
    return SandboxMessageSummary(**_summary_fields(record))


def _summary_fields(record: SandboxRecord) -> dict[str, Any]:
    content = record.content
    delivered = [c for c in record.callbacks if c.delivered_at is not None]
    return {
        "id": record.id,
        "channel": record.channel,
        "provider": record.provider,
        "provider_message_id": record.provider_message_id,
        "delivery_id": record.delivery_id,
        "to": record.to,
        "from_": content.get("from"),
        "subject": content.get("subject") if record.channel == "email" else None,
        "body": content.get("body") if record.channel == "sms" else None,
        "created_at": record.created_at,
        "last_event": delivered[-1].event if delivered else None,
        "callbacks_pending": len(record.callbacks) - len(delivered),
    }


def detail(record: SandboxRecord) -> SandboxMessageDetail:
    """The full view of a record."""
    content = record.content
    callbacks = [
        SandboxCallback(
            seq=c.seq,
            event=c.event,
            due_at=c.due_at,
            delivered_at=c.delivered_at,
            result=c.result,
            payload=c.payload,
        )
        for c in record.callbacks
    ]
    fields = _summary_fields(record)
    if record.channel != "email":
        return SandboxMessageDetail(
            **fields,
            messaging_service_sid=content.get("messaging_service_sid"),
            status_callback=content.get("status_callback"),
            callbacks=callbacks,
        )
    unsubscribe = _header(record, "List-Unsubscribe")
    link = _HTTPS_TARGET.search(unsubscribe or "")
    return SandboxMessageDetail(
        **fields,
        headers=[SandboxHeader(str(n), str(v)) for n, v in content.get("headers") or []],
        tags=content.get("tags") or {},
        list_unsubscribe=unsubscribe,
        list_unsubscribe_post=_header(record, "List-Unsubscribe-Post"),
        unsubscribe_url=link.group(1) if link else None,
        derived_key=_header(record, DERIVED_KEY_HEADER),
        reply_to=list(content.get("reply_to") or []),
        text=content.get("text"),
        html=content.get("html"),
        eml_url=f"/v1/sandbox/messages/{record.id}?format=eml",
        callbacks=callbacks,
    )


async def _written(context: MailboxContext) -> None:
    # Records this process accepted but has not written yet (the writer batches them).
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(context.runner.flush(), FLUSH_WAIT_SECONDS)


class SandboxMailboxController(Controller):
    """The sandbox's mailbox, in the spirit of Mailpit and Twilio's test console."""

    path = "/v1/sandbox/messages"
    tags = ["sandbox"]
    opt = {"scope": "read"}
    dependencies = {"sandbox_mailbox": Provide(provide_mailbox, sync_to_thread=False)}

    @get(
        "/",
        summary="List what the sandbox providers accepted, newest first",
        description=(
            "`to` matches one recipient in any spelling (normalized like a send's); "
            "`channel` narrows to email or SMS. 404 when no provider is the sandbox."
        ),
        responses={404: ResponseSpec(None, description="No provider is the sandbox")},
    )
    async def list_messages(
        self,
        sandbox_mailbox: MailboxContext,
        to: Annotated[str | None, Parameter(min_length=1, max_length=320)] = None,
        channel: Literal["email", "sms"] | None = None,
        limit: Annotated[int, Parameter(ge=1, le=500)] = 50,
        cursor: str | None = None,
    ) -> SandboxMessagePage:
        """A page of messages."""
        channels = tuple(c for c in sandbox_mailbox.channels if channel in (None, c))
        await _written(sandbox_mailbox)
        try:
            records, next_cursor = await sandbox_mailbox.mailbox.page(
                Filter(channels, to), limit=limit, cursor=cursor
            )
        except BadCursor:
            raise ClientException("The cursor is not valid.") from None
        return SandboxMessagePage(items=[summary(r) for r in records], next_cursor=next_cursor)

    @get(
        "/{message_id:uuid}",
        summary="One sandbox message: headers, content, simulated callbacks; or its .eml",
        description=(
            "JSON by default. `format=eml` answers an email as `message/rfc822` (the MIME "
            "message SES would have sent, as an attachment `<id>.eml`); SMS have none (400)."
        ),
        responses={
            404: ResponseSpec(None, description="No such message, or no provider is the sandbox")
        },
    )
    async def show(
        self,
        message_id: uuid.UUID,
        sandbox_mailbox: MailboxContext,
        format_: Annotated[Literal["json", "eml"], QueryParameter(name="format")] = "json",
    ) -> Response[SandboxMessageDetail | bytes]:
        """One message; 404 when there is none."""
        await _written(sandbox_mailbox)
        record = await sandbox_mailbox.mailbox.get(message_id, sandbox_mailbox.channels)
        if record is None:
            raise NotFoundException(f"No sandbox message {message_id}.")
        if format_ == "json":
            return Response(detail(record))
        if record.channel != "email":
            raise HTTPException(
                status_code=400,
                detail="Only email has a MIME form; an SMS is shown as JSON.",
                extra={"type": "urn:problem:eml-email-only"},
            )
        return Response(
            render_mime(record),
            media_type="message/rfc822",
            headers={"Content-Disposition": f'attachment; filename="{record.id}.eml"'},
        )
