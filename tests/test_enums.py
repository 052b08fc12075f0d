"""Every enumerated value the API can return is declared once in code, listed in the OpenAPI
document (where the field is an enum there) and named in the README.

A value added in code but forgotten in the README (as `send_error` was) or in the answer's
type fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from gateway.keys import SCOPES
from retry import dlq
from retry.breaker import STATES as BREAKER_STATES
from sender import campaigns, events, reputation, schemas
from sender import status as st
from sender.reputation_api import ReputationStateName
from suppression import service, views
from suppression.normalize import CHANNELS
from webhooks.outbound import api as outbound_api
from webhooks.outbound import store as outbound_store
from webhooks.state import DISPOSITIONS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
OPENAPI = yaml.safe_load((ROOT / "openapi.yaml").read_text())

# name -> (the values in code, the type the API answers with or None)
ENUMS: dict[str, tuple[tuple[str, ...], Any]] = {
    "delivery status": (st.ALL, schemas.DeliveryStatusName),
    "campaign state": (campaigns.STATES, schemas.CampaignStateName),
    "attempt status": (tuple(s.value for s in st.AttemptStatus), schemas.AttemptStatusName),
    "event disposition": (DISPOSITIONS, schemas.DispositionName),
    "channel": (CHANNELS, views.ChannelName),
    "category": (("transactional", "marketing"), schemas.Category),
    "priority": (("high", "normal", "low"), schemas.Priority),
    "suppression reason": (service.REASONS, views.ReasonName),
    "source type": (service.SOURCE_TYPES, views.SourceTypeName),
    "history action": (service.HISTORY_ACTIONS, views.HistoryActionName),
    "scope": (SCOPES, None),
    "dead-letter reason": (dlq.REASONS, None),
    "dead-letter state": (dlq.STATES, None),
    "breaker state": (BREAKER_STATES, None),
    "readiness status": (("ready", "degraded", "unready"), None),
    "reputation state": (reputation.STATES, ReputationStateName),
    "webhook delivery status": (
        outbound_store.DELIVERY_STATUSES,
        outbound_api.DeliveryStatusName,
    ),
    "webhook endpoint disabled reason": (
        outbound_store.DISABLED_REASONS,
        outbound_api.DisabledReasonName,
    ),
    "event type": (events.EVENT_TYPES, events.EventType),
}

# (schema, property) of openapi.yaml -> the enum it must list
OPENAPI_FIELDS: dict[tuple[str, str], str] = {
    ("DeliveryAnswer", "status"): "delivery status",
    ("DeliveryView", "status"): "delivery status",
    ("CampaignView", "state"): "campaign state",
    ("CampaignSummary", "state"): "campaign state",
    ("CampaignCreated", "state"): "campaign state",
    ("AttemptView", "status"): "attempt status",
    ("EventView", "disposition"): "event disposition",
    ("MessageView", "channel"): "channel",
    ("MessageView", "category"): "category",
    ("MessageView", "priority"): "priority",
    ("SendMessage", "channel"): "channel",
    ("SendMessage", "category"): "category",
    ("SendMessage", "priority"): "priority",
    ("EntryView", "channel"): "channel",
    ("EntryView", "reason"): "suppression reason",
    ("EntryView", "source_type"): "source type",
    ("HistoryView", "action"): "history action",
    ("HistoryView", "source_type"): "source type",
    ("ReputationView", "state"): "reputation state",
    ("WebhookAttemptView", "delivery_status"): "webhook delivery status",
    ("WebhookEndpointView", "disabled_reason"): "webhook endpoint disabled reason",
    ("EventItem", "type"): "event type",
    ("DeliveryStatusView", "status"): "delivery status",
    ("MessageSummary", "channel"): "channel",
    ("MessageSummary", "category"): "category",
    ("MessageSummary", "priority"): "priority",
}


@pytest.mark.parametrize("name", [n for n, (_, t) in ENUMS.items() if t is not None])
def test_answer_types_list_exactly_the_values_in_code(name: str) -> None:
    values, answer_type = ENUMS[name]
    assert set(get_args(answer_type)) == set(values)


def _enum_of(prop: dict[str, Any]) -> set[str]:
    found: set[str] = {v for v in prop.get("enum", ()) if v is not None}
    for option in prop.get("oneOf", ()) + prop.get("anyOf", ()):
        found |= _enum_of(option)
    return found


@pytest.mark.parametrize(("schema", "field"), list(OPENAPI_FIELDS))
def test_openapi_lists_every_value(schema: str, field: str) -> None:
    prop = OPENAPI["components"]["schemas"][schema]["properties"][field]
    values, _ = ENUMS[OPENAPI_FIELDS[(schema, field)]]
    assert _enum_of(prop) == set(values), (schema, field)


def test_openapi_dead_letter_state_parameter() -> None:
    states = {
        tuple(p["schema"].get("enum", ()))
        for path in OPENAPI["paths"].values()
        for op in path.values()
        for p in op.get("parameters", ())
        if p["name"] == "state"
    }
    assert states == {dlq.STATES}


@pytest.mark.parametrize("name", list(ENUMS))
def test_readme_names_every_value(name: str) -> None:
    values, _ = ENUMS[name]
    missing = [v for v in values if f"`{v}`" not in README]
    assert not missing, f"README does not name these {name} values: {missing}"


def _source_types_in_code() -> set[tuple[str, str]]:
    """Every string literal used as a suppression source type: `Source("<type>", ...)`,
    `Source(type="<type>")` and `source_type="<type>"` keyword arguments."""
    found: set[tuple[str, str]] = set()
    for package in ("gateway", "sender", "webhooks", "suppression", "retry"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                candidates: list[ast.expr] = []
                if name == "Source" and node.args:
                    candidates.append(node.args[0])
                for kw in node.keywords:
                    if kw.arg == "source_type" or (name == "Source" and kw.arg == "type"):
                        candidates.append(kw.value)
                for value in candidates:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        found.add((value.value, str(path.relative_to(ROOT))))
    return found


def test_every_source_type_written_by_the_code_is_declared() -> None:
    found = _source_types_in_code()
    assert {"send_error", "operator", "import", "provider_event"} <= {v for v, _ in found}
    undeclared = sorted((v, p) for v, p in found if v not in service.SOURCE_TYPES)
    assert not undeclared


def test_readme_source_type_list_is_complete() -> None:
    # The entries section lists them as `source_type` = `a` | `b` | ...
    match = re.search(r"`source_type` = ((?:`[a-z_]+`(?: \| )?)+)", README)
    assert match, "README has no `source_type` = ... list"
    listed = re.findall(r"`([a-z_]+)`", match.group(1))
    assert set(listed) == set(service.SOURCE_TYPES)
