"""Amazon SES conditions: the one table the send path and the feedback path both classify with.

`CODES` are SESv2 SendEmail exceptions (botocore sesv2 model; ../shared/PROVIDERS.md
section 3); none carries the `retryable` trait, our own retry layer decides. `FEEDBACK` are
the conditions SES reports afterwards (bounce type/subtype, Reject, Rendering Failure), in
the same classes, as `webhooks.classify` looks them up (without the `ses:` prefix); the
feedback table's rows for them are derived from here.

Where both directions can report one condition, `SAME_CONDITION` pairs the send code with
the feedback key, and a test checks that both classifiers agree on it. SES reports few
conditions both ways: a virus is `MessageRejected` at send time or a Reject event after
acceptance. Account states (paused, suspended) only come back from the API; bounces only
from feedback (a send to a suppressed address is accepted and then bounces).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retry.settings import RateSpec
from sender.providers.codes import (
    ACCOUNT,
    PERMANENT_ADDRESS,
    PERMANENT_MESSAGE,
    TRANSIENT,
    ErrorTable,
)
from sender.providers.spec import ProviderContext, SendSpec

CODES: dict[str, tuple[str, str]] = {
    "TooManyRequestsException": (TRANSIENT, "maximum sending rate exceeded"),
    "ThrottlingException": (TRANSIENT, "throttled"),
    # Botocore retries it as throttling, but SES means a resource quota: configuration.
    "LimitExceededException": (ACCOUNT, "limit exceeded"),
    "AccountSuspendedException": (ACCOUNT, "account suspended"),
    "SendingPausedException": (ACCOUNT, "sending paused"),
    "MailFromDomainNotVerifiedException": (ACCOUNT, "MAIL FROM domain not verified"),
    "NotFoundException": (ACCOUNT, "resource not found (configuration set?)"),
    "AccessDeniedException": (ACCOUNT, "access denied"),
    "UnrecognizedClientException": (ACCOUNT, "unrecognized credentials"),
    "InvalidSignatureException": (ACCOUNT, "invalid request signature"),
    "NoCredentials": (ACCOUNT, "no AWS credentials"),
    "MessageRejected": (PERMANENT_MESSAGE, "message rejected"),
    "BadRequestException": (PERMANENT_MESSAGE, "bad request"),
    "ParamValidation": (PERMANENT_MESSAGE, "request failed client-side validation"),
    "InternalFailure": (TRANSIENT, "internal failure"),
    "ServiceUnavailable": (TRANSIENT, "service unavailable"),
}

TABLE = ErrorTable("ses", CODES)

# Feedback conditions (key as `webhooks.classify` builds it, without "ses:").
FEEDBACK: dict[str, tuple[str, str]] = {
    # Reject (a virus) and Rendering Failure: this message can never go; the address is fine.
    "reject": (PERMANENT_MESSAGE, "rejected by SES (virus)"),
    "rendering_failure": (PERMANENT_MESSAGE, "template rendering failed"),
    # Every Permanent subtype is a hard bounce, also unknown ones. Suppressed (global list)
    # and OnAccountSuppressionList mean SES did not even try: still a bad address for us.
    "bounce:Permanent": (PERMANENT_ADDRESS, "permanent bounce"),
    "bounce:Permanent:General": (PERMANENT_ADDRESS, "permanent bounce"),
    "bounce:Permanent:NoEmail": (PERMANENT_ADDRESS, "no such mailbox"),
    "bounce:Permanent:Suppressed": (PERMANENT_ADDRESS, "on the SES global suppression list"),
    "bounce:Permanent:OnAccountSuppressionList": (
        PERMANENT_ADDRESS,
        "on the account's suppression list",
    ),
    # A "transient" bounce whose SMTP status is 5.x.x is a permanent failure in disguise.
    "bounce:Transient:status_5xx": (PERMANENT_ADDRESS, "transient bounce with a 5.x.x status"),
    "bounce:Transient": (TRANSIENT, "soft bounce"),
    "bounce:Undetermined": (TRANSIENT, "undetermined bounce"),
    "bounce:default": (TRANSIENT, "bounce of an unknown type"),
}

# Send code -> feedback key reporting the same condition.
SAME_CONDITION: dict[str, str] = {"MessageRejected": "reject"}


def _build(ctx: ProviderContext) -> Provider:
    from sender.providers.ses import SesProvider  # boto3 is imported on use only

    s = ctx.settings
    return SesProvider(
        region=s.aws_region,
        configuration_set=s.ses_configuration_set,
        max_attempts=s.ses_max_attempts,
        connect_timeout=ctx.connect_timeout,
        read_timeout=ctx.read_timeout,
    )


SEND = SendSpec(
    name="ses",
    channel="email",
    build=_build,
    errors=TABLE,
    # One bucket per account and region; accounts out of the SES sandbox start at 14/s.
    rate_limits={"ses": RateSpec(14.0)},
    settings=("AWS_REGION", "GATEWAY_SES_CONFIGURATION_SET", "GATEWAY_SES_MAX_ATTEMPTS"),
)

if TYPE_CHECKING:
    from sender.providers.base import Provider
