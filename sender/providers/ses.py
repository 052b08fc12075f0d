"""Amazon SES (API v2) send adapter: one `SendEmail` call per delivery.

* Correlation: EmailTags `delivery_id` and `derived_key` (they come back in every event of a
  configuration set's event publishing) plus the header `X-Gateway-Delivery: <derived key>`.
* Retries: SES has no idempotency token, and botocore's standard mode re-sends after read
  timeouts, dropped connections and 5xx answers, which can send a mail twice. The adapter
  sets the retry mode explicitly with a small total attempt budget (`max_attempts`, default
  1 = no botocore retry at all); our own retry layer, which knows about unknown outcomes,
  does the rest.
* Endpoint: nothing is hard-coded; botocore honours `AWS_ENDPOINT_URL_SESV2` (and the other
  standard configuration), which is how tests point it at a local server.
* boto3 is synchronous: calls run on a small dedicated thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from typing import TYPE_CHECKING, Any

import boto3
import botocore.config
import botocore.exceptions

from sender.classify import SendOutcome
from sender.providers.base import OutgoingMessage, parse_retry_after

if TYPE_CHECKING:
    from mypy_boto3_sesv2.client import SESV2Client

log = logging.getLogger("gateway.sender.ses")

CORRELATION_HEADER = "X-Gateway-Delivery"


class SesProvider:
    """Sends email through SESv2 `send_email` with Simple content."""

    name = "ses"
    channel = "email"

    def __init__(
        self,
        *,
        region: str | None = None,
        configuration_set: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        max_attempts: int = 1,
        max_workers: int = 16,
        session: boto3.session.Session | None = None,
    ) -> None:
        config = botocore.config.Config(
            # `total_max_attempts` counts the first request too (botocore's `max_attempts`
            # counts only the retries after it).
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_workers,
        )
        session = session or boto3.session.Session()
        self._client: SESV2Client = session.client("sesv2", region_name=region, config=config)
        self._configuration_set = configuration_set
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="ses-send"
        )

    def limiter_key(self, message: OutgoingMessage) -> str:
        """SES rate limits are per account and region: one bucket."""
        return "ses"

    def request(self, message: OutgoingMessage) -> dict[str, Any]:
        """The `send_email` keyword arguments for one delivery."""
        body: dict[str, Any] = {}
        if message.text is not None:
            body["Text"] = {"Data": message.text, "Charset": "UTF-8"}
        if message.html is not None:
            body["Html"] = {"Data": message.html, "Charset": "UTF-8"}
        headers = [{"Name": name, "Value": value} for name, value in message.headers]
        headers.append({"Name": CORRELATION_HEADER, "Value": message.derived_key})
        tags = [
            {"Name": "delivery_id", "Value": str(message.delivery_id)},
            {"Name": "derived_key", "Value": message.derived_key},
        ]
        tags += [{"Name": k, "Value": v} for k, v in sorted(message.extra_tags.items())]
        kwargs: dict[str, Any] = {
            "Destination": {"ToAddresses": [message.to]},
            "Content": {
                "Simple": {
                    "Subject": {"Data": message.subject or "", "Charset": "UTF-8"},
                    "Body": body,
                    "Headers": headers,
                }
            },
            "EmailTags": tags,
        }
        if message.sender:
            kwargs["FromEmailAddress"] = message.sender
        if message.reply_to:
            kwargs["ReplyToAddresses"] = list(message.reply_to)
        if self._configuration_set:
            kwargs["ConfigurationSetName"] = self._configuration_set
        return kwargs

    async def send(self, message: OutgoingMessage) -> SendOutcome:
        """One `SendEmail` call; every failure is reported, none raised."""
        kwargs = self.request(message)
        loop = asyncio.get_running_loop()
        call = functools.partial(self._client.send_email, **kwargs)
        try:
            response = await loop.run_in_executor(self._executor, call)
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            meta = exc.response.get("ResponseMetadata", {})
            headers = meta.get("HTTPHeaders", {})
            return SendOutcome(
                self.name,
                error_code=error.get("Code") or None,
                http_status=meta.get("HTTPStatusCode"),
                retry_after=parse_retry_after(headers.get("retry-after")),
                message=error.get("Message"),
            )
        except botocore.exceptions.ConnectionError as exc:
            # Connect timeout, refused connection, DNS, TLS handshake: nothing reached SES.
            return SendOutcome(self.name, transport="not_sent", message=str(exc))
        except botocore.exceptions.HTTPClientError as exc:
            # Read timeout or a connection closed after the request was written: SES may
            # have accepted the mail. Never treat this as a failure.
            return SendOutcome(self.name, transport="after_send", message=str(exc))
        except botocore.exceptions.NoCredentialsError as exc:
            return SendOutcome(self.name, error_code="NoCredentials", message=str(exc))
        except botocore.exceptions.ParamValidationError as exc:
            return SendOutcome(self.name, error_code="ParamValidation", message=str(exc))
        except Exception as exc:
            # Anything else happened somewhere inside the call: we cannot know whether the
            # request went out, so the outcome is unknown (settled by callbacks).
            log.exception("unexpected error from SES send_email")
            return SendOutcome(self.name, transport="after_send", message=repr(exc))
        return SendOutcome(self.name, provider_message_id=response["MessageId"])

    async def close(self) -> None:
        """Stop the thread pool and the HTTP connections."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()
