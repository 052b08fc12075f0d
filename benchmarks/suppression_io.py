"""Benchmark of the suppression list's bulk paths (not a test): import, export, check.

Run: ``.venv/bin/python benchmarks/suppression_io.py [--rows 1000000]``. Uses DATABASE_URL
when set (a scratch database is created and dropped on that server), else an embedded
PostgreSQL. Steps:

1. writes a CSV file in our import format with `--rows` rows (unique addresses, a mix of
   reasons and scopes) to a temporary file;
2. `import`: the work behind `gateway suppressions import FILE` in a child process;
   prints rows/s and the child's peak RSS;
3. `export`: the work behind `gateway suppressions export --format csv` (addresses
   decrypted) in a child process, to /dev/null; prints rows/s and peak RSS;
4. `check`: in-process through the app (httpx ASGI transport, no HTTP server), one client:
   `POST /v1/suppressions/check` with one address (req/s, p50) and with 10,000 addresses
   against the imported list (ms).

Each bulk phase runs in its own process so that its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from cryptography.fernet import Fernet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The same scratch server and URL helpers as the send/callback benchmark.
from benchmarks.send import _server_url, _sync  # noqa: E402

REASONS = ("hard_bounce", "complaint", "manual", "invalid_address", "unsubscribe")


def _address(i: int) -> str:
    return f"user.{i}@example{i % 97}.com"


def write_file(path: Path, rows: int) -> None:
    """Our CSV import format: channel,address,reason,scope,expires_at."""
    with path.open("w", encoding="utf-8") as out:
        out.write("channel,address,reason,scope,expires_at\n")
        for i in range(rows):
            reason = REASONS[i % len(REASONS)]
            scope = "marketing" if reason == "unsubscribe" else "all"
            out.write(f"email,{_address(i)},{reason},{scope},\n")


def _settings(url: str) -> object:
    from gateway.settings import load_settings

    env = {
        "DATABASE_URL": url,
        "GATEWAY_SECRET_KEYS": os.environ["BENCH_FERNET_KEY"],
        "GATEWAY_HASH_KEY": os.environ["BENCH_HASH_KEY"],
        "GATEWAY_WORKER_ENABLED": "false",
    }
    return load_settings(env)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _phase_import(url: str, file: str) -> dict[str, float]:
    from gateway.services import build_services
    from suppression import commands
    from suppression.formats import ImportOptions

    services = build_services(_settings(url), url)  # type: ignore[arg-type]
    try:
        context = services.suppression
        start = time.perf_counter()
        with open(file, "rb") as source:  # noqa: ASYNC230  (as the CLI does)
            report = await commands.import_file(
                context, source, ImportOptions(), actor="bench", err=io.StringIO()
            )
        seconds = time.perf_counter() - start
    finally:
        await services.close()
    rows = report.added + report.already_present + report.invalid_count
    return {"rows": rows, "added": report.added, "seconds": seconds}


async def _phase_export(url: str) -> dict[str, float]:
    from gateway.services import build_services
    from suppression import commands

    services = build_services(_settings(url), url)  # type: ignore[arg-type]
    try:
        context = services.suppression
        start = time.perf_counter()
        with open(os.devnull, "wb") as out:  # noqa: ASYNC230
            rows = await commands.export_file(
                context, out, fmt="csv", since=None, err=io.StringIO()
            )
        seconds = time.perf_counter() - start
    finally:
        await services.close()
    return {"rows": rows, "seconds": seconds}


async def _phase_check(url: str, rows: int, n: int) -> dict[str, float]:
    import httpx

    from gateway.app import create_app
    from gateway.keys import create_key
    from gateway.services import build_services

    services = build_services(_settings(url), url)  # type: ignore[arg-type]
    try:
        async with services.sessions() as session:
            _, key = await create_key(session, ["read"])
            await session.commit()
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="https://gw.bench") as client:
            auth = {"Authorization": f"Bearer {key}"}

            async def one(i: int) -> float:
                start = time.perf_counter()
                r = await client.post(
                    "/v1/suppressions/check",
                    headers=auth,
                    json={"channel": "email", "addresses": [_address(i % max(rows, 1))]},
                )
                took = time.perf_counter() - start
                if r.status_code != 200:
                    raise SystemExit(f"check: {r.status_code} {r.text[:300]}")
                return took

            for i in range(50):
                await one(i)
            samples = [await one(i * 7919) for i in range(n)]
            batch = [_address((i * 104729) % max(rows, 1)) for i in range(10_000)]
            batch_times = []
            for _ in range(5):
                start = time.perf_counter()
                r = await client.post(
                    "/v1/suppressions/check",
                    headers=auth,
                    json={"channel": "email", "addresses": batch, "category": "transactional"},
                )
                batch_times.append(time.perf_counter() - start)
                if r.status_code != 200:
                    raise SystemExit(f"check 10k: {r.status_code} {r.text[:300]}")
            found = len(r.json()["suppressed"])
    finally:
        await services.close()
    return {
        "one_p50_ms": statistics.median(samples) * 1000,
        "one_rps": len(samples) / sum(samples),
        "batch_ms": statistics.median(batch_times) * 1000,
        "batch_found": found,
    }


def _child(args: argparse.Namespace) -> None:
    if args.phase == "import":
        result = asyncio.run(_phase_import(args.url, args.file))
    elif args.phase == "export":
        result = asyncio.run(_phase_export(args.url))
    else:
        result = asyncio.run(_phase_check(args.url, args.rows, args.n))
    result["peak_rss_mb"] = _peak_rss_mb()
    print(json.dumps(result))


def _run_child(phase: str, url: str, env: dict[str, str], *extra: str) -> dict[str, float]:
    out = subprocess.run(  # noqa: S603  (this script, with its own arguments)
        [sys.executable, __file__, "--phase", phase, "--url", url, *extra],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    last: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return last


def main(args: argparse.Namespace) -> None:
    """Create a scratch database, run each phase in a child process, drop it."""
    from gateway import migrate

    server, cleanup = _server_url()
    name = f"gwbench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(_sync(server), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server).set(database=name).render_as_string(False)
    env = dict(os.environ)
    env["BENCH_FERNET_KEY"] = Fernet.generate_key().decode()
    env["BENCH_HASH_KEY"] = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    try:
        migrate.upgrade(url)
        with tempfile.TemporaryDirectory(prefix="gwsuppio") as tmp:
            file = Path(tmp) / "import.csv"
            write_file(file, args.rows)
            print(f"rows={args.rows} file={file.stat().st_size / 1e6:.1f} MB")
            imp = _run_child("import", url, env, "--file", str(file))
        print(
            f"import  {imp['rows']:>9.0f} rows  {imp['seconds']:7.1f} s  "
            f"{imp['rows'] / imp['seconds']:8.0f} rows/s  peak RSS {imp['peak_rss_mb']:.0f} MB"
        )
        exp = _run_child("export", url, env)
        print(
            f"export  {exp['rows']:>9.0f} rows  {exp['seconds']:7.1f} s  "
            f"{exp['rows'] / exp['seconds']:8.0f} rows/s  peak RSS {exp['peak_rss_mb']:.0f} MB"
        )
        if not args.skip_check:
            chk = _run_child("check", url, env, "--rows", str(args.rows), "--n", str(args.n))
            print(
                f"check   1 address: p50 {chk['one_p50_ms']:.2f} ms, {chk['one_rps']:.0f} req/s "
                f"(in-process, 1 client); 10,000 addresses: {chk['batch_ms']:.0f} ms "
                f"({chk['batch_found']:.0f} suppressed)"
            )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, default=2000, help="single-address checks")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--phase", choices=("import", "export", "check"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.phase:
        _child(parsed)
    else:
        main(parsed)
