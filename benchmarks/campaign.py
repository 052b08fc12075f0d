"""The `campaign` bench scenario (``./dev bench --scenario campaign``): campaign scale.

Provider stubs of their own (``benchmarks.stubserve --rate 500``): at most 500 calls a second
per key, throttling beyond like the providers do; the gateway's limiter is set to the same
500/s (``twilio:*=500``, shared through Redis). Measured:

1. Asynchronous acceptance: 1-recipient SMS sends with ``Prefer: respond-async`` at 16
   connections against one ``gateway serve`` process, compared with the insert floor (target
   >= 50 %). The accepted deliveries are then cancelled so they do not feed the drain.
2. A campaign (200,000 recipients; ``--quick`` 20,000) of `low` marketing SMS: created,
   its list streamed as JSON Lines, started; several ``gateway worker`` processes expand and
   send it. Expansion rate = recipients / (last delivery created - start), target >= 10,000/s;
   drain rate = accepted provider calls per second between 10 % and 90 % of them, against the
   500/s limit (target >= 90 %).
3. While it drains, probes through the serving process: `high` OTP SMS (alternately inline
   and `respond-async`) and `normal` transactional SMS (async), 4 a second. Latency = the
   probe's arrival at the stub (its probe log) minus the moment the bench sent the request
   (so it includes the request itself); p99 targets 2 s (`high`) and 10 s (`normal`). A probe
   that never reached the provider counts as infinitely late.

It also records the plan of the worker's claim (EXPLAIN of each lane's statement) while the
campaign's backlog is queued.
"""

# ruff: noqa: S603  (starts local processes)

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import text

from benchmarks.load import module_command
from benchmarks.report import Row

if TYPE_CHECKING:
    from benchmarks.run import Bench

PROVIDER_LIMIT = 500.0
WORKER_PROCESSES = 3
HIGH_PREFIX = "+1415250"
NORMAL_PREFIX = "+1415260"
PROBES_PER_SECOND = 4.0


def _log(message: str) -> None:
    from benchmarks.run import log

    log(message)


def _numbers(n: int) -> Iterator[bytes]:
    """JSON Lines of `n` distinct valid US numbers (exchanges 230-...)."""
    chunk: list[str] = []
    for i in range(n):
        chunk.append(json.dumps({"to": f"+1415{230 + i // 10000}{i % 10000:04d}"}))
        if len(chunk) == 5000:
            yield ("\n".join(chunk) + "\n").encode()
            chunk = []
    if chunk:
        yield ("\n".join(chunk) + "\n").encode()


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


class Probes(threading.Thread):
    """Sends the latency probes until stopped; remembers when each was sent."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.base = base
        self.headers = headers
        self.sent: dict[str, tuple[str, float]] = {}
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            k = 0
            while not self.stopping.is_set():
                k += 1
                high = k % 2 == 1
                inline = high and k % 4 == 1
                to = f"{HIGH_PREFIX if high else NORMAL_PREFIX}{k % 10000:04d}"
                kind = "high_inline" if inline else "high_async" if high else "normal_async"
                body = {
                    "channel": "sms",
                    "to": [to],
                    "body": "Your code is 123456" if high else "Your receipt",
                    "priority": "high" if high else "normal",
                }
                headers = {**self.headers, "Idempotency-Key": f'"probe-{uuid.uuid4()}"'}
                if not inline:
                    headers["Prefer"] = "respond-async"
                at = time.time()
                try:
                    answer = client.post(self.base + "/v1/messages", json=body, headers=headers)
                    if answer.status_code >= 300:
                        self.failures.append(f"{answer.status_code} {answer.text[:200]}")
                    else:
                        self.sent[to] = (kind, at)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.stopping.wait(1 / PROBES_PER_SECOND)


def run_campaign(bench: Bench) -> None:
    """The scenario (see the module docstring); figures go to `bench.extra["campaign"]`."""
    from benchmarks.run import GATEWAY, SMS_FROM, stop

    size = bench.args.campaign_size or (20_000 if bench.quick else 200_000)
    result: dict[str, Any] = {"size": size, "worker_processes": WORKER_PROCESSES}
    bench.extra["campaign"] = result
    # The floors were measured at the start of the repetition; their pools and the other
    # scenarios' gateways would hold connections this scenario's processes need (a shared
    # PostgreSQL allows 100).
    for proc in bench.infra.procs:
        if "benchmarks.floors" in " ".join(map(str, proc.args)):
            stop(proc)
    for other in list(bench.gateways.values()):
        stop(other.proc)
    bench.gateways.clear()
    probe_log = bench.infra.tmp / "probes.jsonl"
    stub_proc = subprocess.Popen(
        [
            *module_command("benchmarks.stubserve"),
            "--rate",
            str(PROVIDER_LIMIT),
            "--probe-log",
            str(probe_log),
            "--probe-prefix",
            f"{HIGH_PREFIX},{NORMAL_PREFIX}",
        ],
        cwd=bench.infra.tmp,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    bench.infra.procs.append(stub_proc)
    assert stub_proc.stdout is not None
    stubs = json.loads(stub_proc.stdout.readline())
    provider_env = {
        "GATEWAY_SMS_PROVIDER": "twilio",
        "GATEWAY_TWILIO_API_BASE": stubs["twilio"],
        "GATEWAY_TWILIO_ACCOUNT_SID": stubs["twilio_account_sid"],
        "GATEWAY_TWILIO_AUTH_TOKEN": stubs["twilio_auth_token"],
        "GATEWAY_SMS_FROM": SMS_FROM,
        "GATEWAY_RATE_LIMITS": f"twilio:*={PROVIDER_LIMIT:g}",
    }
    gw = bench.start_gateway("campaign", **provider_env, GATEWAY_DB_POOL_SIZE="12")
    headers = bench.auth()

    # 1. Asynchronous acceptance vs the insert floor.
    spec = bench.send_spec(gw.base, {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"})
    spec.headers["Prefer"] = "respond-async"
    bench.measure("accept_async", spec)
    with bench.engine.begin() as conn:
        # Not part of the campaign: they must not feed its drain.
        conn.execute(
            text(
                "UPDATE deliveries SET status = 'cancelled', next_attempt_at = NULL "
                "WHERE status = 'queued'"
            )
        )
        conn.execute(text("ANALYZE deliveries"))

    # 2. The campaign, with several worker processes.
    workers = [
        bench.spawn(
            f"worker-{i}",
            [GATEWAY, "worker"],
            bench.base_env(
                **provider_env,
                GATEWAY_PUBLIC_URL=gw.base,
                GATEWAY_WORKER_ENABLED="true",
                GATEWAY_LOG_LEVEL="INFO",
                # A campaign is served by the low lane only: 16 slots a process, 48 calls in
                # flight, cover 500/s at up to ~90 ms per call (8 left the drain bound by
                # the calls' latency under load). A dispatch holds a connection only for its
                # statements.
                GATEWAY_WORKER_CONCURRENCY="16",
                GATEWAY_DB_POOL_SIZE="8",
            ),
        )
        for i in range(WORKER_PROCESSES)
    ]
    probes = Probes(gw.base, headers)
    try:
        with httpx.Client(base_url=gw.base, headers=headers, timeout=600) as client:
            created = client.post(
                "/v1/campaigns",
                json={
                    "channel": "sms",
                    "body": "Spring sale: 20 % off today",
                    "category": "marketing",
                    "priority": "low",
                },
                headers={"Idempotency-Key": f'"bench-{uuid.uuid4()}"'},
            )
            created.raise_for_status()
            campaign = created.json()["id"]
            start = time.perf_counter()
            loaded = client.put(
                f"/v1/campaigns/{campaign}/recipients",
                content=_numbers(size),
                headers={"Content-Type": "application/x-ndjson"},
            )
            loaded.raise_for_status()
            result["upload_seconds"] = time.perf_counter() - start
            result["upload"] = loaded.json()
            _log(f"campaign: {size:,} recipients uploaded in {result['upload_seconds']:.1f} s")
            client.post(f"/v1/campaigns/{campaign}/start").raise_for_status()
            probes.start()
            _drain(bench, client, campaign, size, result)
    finally:
        probes.stopping.set()
        if probes.is_alive():
            probes.join(timeout=60)
        for proc in workers:
            stop(proc)
        stop(gw.proc)
        bench.gateways.pop("campaign", None)
        stop(stub_proc)
    result["probe_failures"] = probes.failures[:5]
    _latencies(probes, probe_log, result)
    _log(f"campaign: {json.dumps(result)}")


def _drain(
    bench: Bench, client: httpx.Client, campaign: str, size: int, result: dict[str, Any]
) -> None:
    """Wait until the campaign is done (bounded), recording the expansion and the drain."""
    budget = size / (PROVIDER_LIMIT * 0.5) + 180
    deadline = time.monotonic() + budget
    explained = False
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = client.get(f"/v1/campaigns/{campaign}").json()
        counts = view["counts"]
        if not explained and view["state"] != "expanding" and counts["queued"] > size // 4:
            result["claim_plans"] = _explain(bench)
            explained = True
        if view["state"] in ("done", "cancelled"):
            break
        time.sleep(1.0)
    else:
        result["note"] = f"not done after {budget:.0f} s: cancelled"
        client.post(f"/v1/campaigns/{campaign}/cancel")
        view = client.get(f"/v1/campaigns/{campaign}").json()
    result["state"] = view.get("state")
    result["counts"] = view.get("counts")
    with bench.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT c.started_at, c.message_id, (SELECT max(d.created_at) FROM deliveries d "
                "WHERE d.message_id = c.message_id), (SELECT count(*) FROM deliveries d "
                "WHERE d.message_id = c.message_id) FROM campaigns c WHERE c.id = :id"
            ),
            {"id": campaign},
        ).one()
        started, message_id, last_created, expanded = row
        if last_created is not None and started is not None:
            seconds = max((last_created - started).total_seconds(), 1e-3)
            result["expanded"] = int(expanded)
            result["expansion_seconds"] = seconds
            result["expansion_per_second"] = expanded / seconds
        calls = conn.execute(
            text(
                "SELECT count(*), percentile_disc(0.1) WITHIN GROUP (ORDER BY a.started_at), "
                "percentile_disc(0.9) WITHIN GROUP (ORDER BY a.started_at) FROM attempts a "
                "JOIN deliveries d ON d.id = a.delivery_id "
                "WHERE d.message_id = :m AND a.status = 'accepted'"
            ),
            {"m": message_id},
        ).one()
        accepted, t10, t90 = calls
        result["accepted_calls"] = int(accepted)
        if accepted and t10 is not None and t90 is not None and t90 > t10:
            result["drain_per_second"] = 0.8 * accepted / (t90 - t10).total_seconds()
        throttled = conn.execute(
            text(
                "SELECT count(*) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id "
                "WHERE d.message_id = :m AND a.status <> 'accepted'"
            ),
            {"m": message_id},
        ).scalar_one()
        result["unaccepted_attempts"] = int(throttled)


def _explain(bench: Bench) -> dict[str, str]:
    """The plans of the lanes' claim statements with the campaign's backlog queued."""
    from sender.log import _CLAIM_DUE, _CLAIMABLE

    plans: dict[str, str] = {}
    sql = (
        _CLAIM_DUE.replace("$1", "now()")
        .replace("$2", "20")
        .replace("$3::text[]", "ARRAY[" + ",".join(f"'{s}'" for s in _CLAIMABLE) + "]")
    )
    with bench.engine.connect() as conn:
        for lane, low, high in (("high", 2, 2), ("low", 0, 2)):
            query = sql.replace("$4", str(low)).replace("$5", str(high))
            # EXPLAIN without ANALYZE: the claim is not run (it would take the rows).
            lines = conn.execute(text("EXPLAIN " + query)).scalars().all()
            plans[lane] = "\n".join(lines)
            _log(f"claim plan, {lane} lane:\n" + plans[lane])
    return plans


def _latencies(probes: Probes, probe_log: Any, result: dict[str, Any]) -> None:
    arrived: dict[str, float] = {}
    if probe_log.exists():
        for line in probe_log.read_text().splitlines():
            record = json.loads(line)
            arrived.setdefault(record["to"], record["at"])
    by_kind: dict[str, list[float]] = {}
    missing: dict[str, int] = {}
    for to, (kind, at) in probes.sent.items():
        reached = arrived.get(to)
        if reached is None:
            missing[kind] = missing.get(kind, 0) + 1
            by_kind.setdefault(kind, []).append(math.inf)
        else:
            by_kind.setdefault(kind, []).append(max(0.0, reached - at) * 1000)
    result["probes"] = {k: len(v) for k, v in by_kind.items()}
    result["probes_missing"] = missing
    groups = {
        **by_kind,
        "high": by_kind.get("high_inline", []) + by_kind.get("high_async", []),
        "normal": by_kind.get("normal_async", []),
    }
    for kind, values in groups.items():
        p99 = _p99(values)
        # JSON has no infinity: a p99 that is a probe that never arrived is stored as None
        # with `<kind>_never_arrived`.
        result[f"p99_ms_{kind}"] = p99 if p99 is not None and math.isfinite(p99) else None
        if p99 is not None and math.isinf(p99):
            result[f"p99_{kind}_never_arrived"] = True


def campaign_rows(bench: Bench, insert_floor: float | None) -> list[Row]:
    """The scenario's lines of the result table."""
    info = bench.extra.get("campaign")
    if info is None:
        return []
    note = "quick size" if info["size"] < 200_000 else ""
    rows = []
    accept = bench.rps("accept_async")
    if accept is not None:
        rows.append(
            Row(
                "accept, respond-async, 1 SMS",
                accept,
                "req/s",
                insert_floor,
                "insert floor",
                (">=", 0.5),
                [round(r.rps, 1) for r in bench.samples.get("accept_async", [])],
            )
        )
    size = f"{info['size']:,}"
    rows.append(
        Row(
            f"campaign {size}: expansion",
            info.get("expansion_per_second"),
            "recipients/s",
            target=(">=", 10_000.0),
            note=note,
        )
    )
    rows.append(
        Row(
            f"campaign {size}: drain, {info['worker_processes']} workers",
            info.get("drain_per_second"),
            "sends/s",
            PROVIDER_LIMIT,
            "provider limit",
            (">=", 0.9),
            note=info.get("note", note),
        )
    )
    for key, label, bound in (
        ("p99_ms_high", "high OTP, acceptance -> provider, p99", 2000.0),
        ("p99_ms_normal", "normal transactional, acceptance -> provider, p99", 10000.0),
    ):
        never = info.get(key.replace("_ms_", "_") + "_never_arrived", False)
        rows.append(
            Row(
                label + " (while draining)",
                info.get(key),
                "ms",
                target=("<=", bound),
                note="probes never reached the provider" if never else note,
            )
        )
    return rows
