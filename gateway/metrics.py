"""`GET /metrics`: every metric family in the Prometheus text format, with prometheus-client.

Two kinds of families:

* **Events counted in the process** (sends, provider call and request durations,
  suppression hits, webhook refusals, provider events, callback lag, rate-limiter grants and
  deferrals, provider flags): prometheus-client counters and histograms defined next to the
  code that counts them (`sender.dispatch`, `webhooks.errors`, `webhooks.ingest`) or here
  (request duration). A hot path pays one in-memory increment, no I/O.
* **State of the database and shared state** (retry queue depth and the age of the oldest
  due delivery, dead-letter queue depth, circuit-breaker state, reputation rates, outbound
  backlog): computed once per scrape, by the process that answers it, from PostgreSQL (and
  Redis for the breaker); never kept per process, so never multiplied by the process count.

Several processes (`gateway serve --workers N`, `gateway worker` on the same host) share
their counters through prometheus-client's **multiprocess mode**: `enable_multiprocess`
points `PROMETHEUS_MULTIPROC_DIR` at `GATEWAY_METRICS_DIR` (default `<data dir>/metrics`)
before any metric is created, each process writes its own memory-mapped files there, and a
scrape of any one process sums every process's files. `gateway serve` empties the files of
processes that are no longer running when it starts (a counter restart, as after any
restart). Without that variable (tests, embedding) the process's own registry is exposed.

No label value is a recipient address or number, an API key or a message id: labels are
channels, provider names, classification kinds, reasons, rule keys, normalized event types,
routes (templates, not paths), rate-limit keys and sender identities.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from litestar import MediaType, Response, get
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from gateway.services import Services
from gateway.settings import Settings

if TYPE_CHECKING:
    from suppression.db import Pg

log = logging.getLogger("gateway")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exact Content-Type of `/metrics` (Prometheus text exposition format 0.0.4)."""
# Litestar appends `; charset=utf-8` to every text/* media type itself.
_MEDIA_TYPE = "text/plain; version=0.0.4"

# Providers whose circuit state is reported: the registered ones (`services.providers`,
# gateway/providers.py; the sandbox adapters use the same names).
CHANNELS = ("email", "sms")

REQUEST_SECONDS = Histogram(
    "gateway_http_request_seconds",
    "Duration of an HTTP request, whole (a send: validation, claim, provider calls, record).",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    """Count one answered request; `route` is the route's template (`/v1/messages/{id}`)."""
    REQUEST_SECONDS.labels(method, route, str(status)).observe(seconds)


# -- multiprocess mode ----------------------------------------------------------------------------


def metrics_dir(settings: Settings) -> Path:
    """The multiprocess directory: PROMETHEUS_MULTIPROC_DIR when set (e.g. inherited from
    `gateway serve`), else GATEWAY_METRICS_DIR, else `<data dir>/metrics`."""
    inherited = os.environ.get(MULTIPROC_ENV)
    if inherited:
        return Path(inherited)
    return settings.metrics_dir or settings.data_dir / "metrics"


def enable_multiprocess(settings: Settings, *, clean: bool) -> Path:
    """Put this process (and the processes it starts, which inherit the environment) in
    prometheus-client's multiprocess mode; `clean` (the `serve` parent) removes the files of
    processes that are no longer running. Call before any metric is incremented."""
    path = metrics_dir(settings).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # A read-only working directory (a container without GATEWAY_METRICS_DIR): the
        # processes this one starts still share a directory; a separate `gateway worker`
        # does not (set GATEWAY_METRICS_DIR for that).
        path = Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
        log.warning("metrics directory not writable (%s): using %s", type(exc).__name__, path)
    if clean:
        for file in path.glob("*.db"):
            pid = file.stem.rsplit("_", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    file.unlink()
    os.environ[MULTIPROC_ENV] = str(path)
    # prometheus-client picks its value store when `prometheus_client.values` is imported;
    # the metric modules may have been imported already (children are created on first use,
    # each with the store chosen now).
    from prometheus_client import values

    # prometheus-client's default asks the OS for the pid (a system call) on every change of
    # every value, to notice a fork; the pid cached here is refreshed in a forked child.
    values.ValueClass = values.MultiProcessValue(process_identifier=_pid)  # type: ignore[no-untyped-call]
    return path


_cached_pid = os.getpid()


def _pid() -> int:
    return _cached_pid


def _refresh_pid() -> None:
    global _cached_pid
    _cached_pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def multiprocess() -> bool:
    """Is this process in multiprocess mode?"""
    return bool(os.environ.get(MULTIPROC_ENV))


# -- hooks for families other parts provide ----------------------------------------------------


async def reputation_rates(services: Services, conn: Pg) -> Iterable[tuple[str, str, float]]:
    """HOOK (reputation guard): the rolling rates per sender identity, as
    (identity, kind, ratio 0..1) with kind `bounce` or `complaint` (email: From domain) and
    `failure` or `opt_out` (SMS sender). Rendered as `gateway_reputation_ratio{identity,kind}`.
    Read from `reputation_states`, which the worker's evaluation writes (sender.reputation),
    so every process reports the same figures. Called once per scrape with its connection."""
    from sender.reputation import metric_ratios

    return await metric_ratios(conn)


async def reputation_states(services: Services, conn: Pg) -> Iterable[tuple[str, str]]:
    """(identity, state) per sender identity, rendered as
    `gateway_reputation_state{identity,state}` (1 for the current state: `ok`,
    `marketing_paused`, `all_paused`, else 0). Called once per scrape."""
    from sender.reputation import metric_states

    return await metric_states(conn)


async def outbound_backlog(services: Services, conn: Pg) -> int | None:
    """How many outbound events wait to be delivered to subscribers (pending pushes of
    `webhooks.outbound`), rendered as `gateway_outbound_event_backlog`; None leaves the family
    without a sample. Called once per scrape."""
    from webhooks.outbound.store import pending_count

    return await pending_count(conn)


# -- the scrape ----------------------------------------------------------------------------------


async def database_families(services: Services, *, now: dt.datetime | None = None) -> list[Metric]:
    """The families describing shared state, computed once for this scrape: the retry queue,
    the dead-letter queue, circuit breakers, reputation rates and the outbound backlog.

    When the database does not answer, its families are left out and
    `gateway_metrics_database_ok` is 0 (the counters are still served)."""
    from retry.dlq import open_depth_by_reason
    from retry.shared import SharedStateUnavailable
    from sender import log as delivery_log
    from suppression.db import pg_connection, utcnow

    now = now or utcnow()
    families: list[Metric] = []
    ok = GaugeMetricFamily(
        "gateway_metrics_database_ok",
        "1 when this scrape read the database-derived families, 0 when the database failed.",
    )
    try:
        async with pg_connection(services.engine) as conn:
            queue = await delivery_log.queue_stats(conn, now=now)
            dead = await open_depth_by_reason(conn)
            rates = list(await reputation_rates(services, conn))
            standings = list(await reputation_states(services, conn))
            backlog = await outbound_backlog(services, conn)
    except Exception as exc:
        log.warning("metrics: database families unavailable (%s)", type(exc).__name__)
        ok.add_metric([], 0)
        families.append(ok)
    else:
        ok.add_metric([], 1)
        families += [ok, *_queue_families(queue, now), _dlq_family(dead)]
        families += _reputation_families(rates, backlog)
        families.append(_reputation_state_family(standings))
    breaker = GaugeMetricFamily(
        "gateway_circuit_breaker_state",
        "1 for each provider's current circuit state (closed, open, half_open), else 0.",
        labels=["provider", "state"],
    )
    from retry.breaker import STATES

    for provider in (r.name for r in services.providers):
        try:
            state = await services.breaker.state(provider)
        except SharedStateUnavailable:
            continue  # Redis is down: no answer rather than a guess
        for name in STATES:
            breaker.add_metric([provider, name], 1.0 if state == name else 0.0)
    families.append(breaker)
    return families


def _queue_families(
    rows: Sequence[tuple[str, str, int, dt.datetime | None]], now: dt.datetime
) -> list[Metric]:
    from sender import status as st

    depth = GaugeMetricFamily(
        "gateway_retry_queue_depth",
        "Deliveries waiting on the retry queue (scheduled for the worker), by channel and status.",
        labels=["channel", "status"],
    )
    age = GaugeMetricFamily(
        "gateway_retry_oldest_due_age_seconds",
        "How long the oldest due delivery has been due (0 when none is due), by channel.",
        labels=["channel"],
    )
    counts = {(c, s): 0 for c in CHANNELS for s in sorted(st.DISPATCHABLE)}
    oldest: dict[str, dt.datetime] = {}
    for channel, status, n, due in rows:
        counts[(channel, status)] = n
        if due is not None and (channel not in oldest or due < oldest[channel]):
            oldest[channel] = due
    for (channel, status), n in sorted(counts.items()):
        depth.add_metric([channel, status], n)
    for channel in sorted({c for c, _ in counts}):
        due = oldest.get(channel)
        age.add_metric([channel], max(0.0, (now - due).total_seconds()) if due else 0.0)
    return [depth, age]


def _dlq_family(depth: dict[str, int]) -> Metric:
    family = GaugeMetricFamily(
        "gateway_dlq_depth",
        "Unresolved dead-letter entries, by reason.",
        labels=["reason"],
    )
    for reason, n in sorted(depth.items()):
        family.add_metric([reason], n)
    return family


def _reputation_families(
    rates: Sequence[tuple[str, str, float]], backlog: int | None
) -> list[Metric]:
    ratio = GaugeMetricFamily(
        "gateway_reputation_ratio",
        "Rolling bounce/complaint (email) and failure/opt-out (SMS) rates per sender identity.",
        labels=["identity", "kind"],
    )
    for identity, kind, value in rates:
        ratio.add_metric([identity, kind], value)
    outbound = GaugeMetricFamily(
        "gateway_outbound_event_backlog",
        "Outbound events not yet delivered to their subscribers.",
    )
    if backlog is not None:
        outbound.add_metric([], backlog)
    return [ratio, outbound]


def _reputation_state_family(standings: Sequence[tuple[str, str]]) -> Metric:
    from sender.reputation import STATES

    family = GaugeMetricFamily(
        "gateway_reputation_state",
        "1 for each sender identity's current reputation guard state, else 0.",
        labels=["identity", "state"],
    )
    for identity, current in standings:
        for state in STATES:
            family.add_metric([identity, state], 1.0 if state == current else 0.0)
    return family


class _Families(Collector):
    """Families computed already (one scrape's), served by a throw-away registry."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        """The families, as given."""
        return iter(self._families)


def process_families() -> list[Metric]:
    """The counted families: summed over every process's files in multiprocess mode, else
    this process's registry."""
    if multiprocess():
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return list(registry.collect())
    return list(REGISTRY.collect())


def counter_values(name: str) -> dict[tuple[str, ...], float]:
    """A counter's values by label values (in label order), summed over the host's processes
    like a scrape (e.g. for the console): `name` without `_total`."""
    values: dict[tuple[str, ...], float] = {}
    for family in process_families():
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_total":
                key = tuple(sample.labels.values())
                values[key] = values.get(key, 0.0) + sample.value
    return values


def render(extra: Iterable[Metric] = ()) -> bytes:
    """The exposition: every counted family, then `extra` (a scrape's database families)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*process_families(), *extra]))
    return generate_latest(registry)


@get(
    "/metrics",
    tags=["health"],
    media_type=MediaType.TEXT,
    summary="Metrics (Prometheus text format)",
)
async def metrics(services: Services) -> Response[bytes]:
    """Every metric family (see README "Metrics"); no authentication, no personal data."""
    started = time.perf_counter()
    families = await database_families(services)
    scrape = GaugeMetricFamily(
        "gateway_metrics_scrape_seconds", "Time this scrape spent reading shared state."
    )
    scrape.add_metric([], time.perf_counter() - started)
    return Response(render([*families, scrape]), media_type=_MEDIA_TYPE)
