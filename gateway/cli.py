"""The `gateway` command: serve, worker, migrate, openapi, keys, suppressions, dlq, events,
webhooks, report."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import sys
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any, BinaryIO

from gateway.settings import Settings, SettingsError, load_settings

log = logging.getLogger("gateway")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _logging(settings: Settings) -> None:
    from gateway.runtime import configure_logging

    configure_logging(settings)


def _metrics(settings: Settings, *, clean: bool) -> None:
    # Counters shared by every process of this host (serve's workers, gateway worker): see
    # gateway.metrics. The `serve` parent clears the files of processes no longer running.
    from gateway.metrics import enable_multiprocess

    enable_multiprocess(settings, clean=clean)


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the HTTP server (and the retry worker unless disabled), in `--workers` processes."""
    from gateway.serve import serve

    settings = _settings()
    _logging(settings)
    _metrics(settings, clean=True)
    return serve(settings, host=args.host, port=args.port, workers=args.workers)


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the retry worker alone (any number may run side by side)."""
    from gateway.runtime import prepare, services_for
    from gateway.worker import run_worker_until_signalled

    settings = _settings()
    _logging(settings)
    _metrics(settings, clean=False)
    services = services_for(prepare(settings))
    try:
        _run_loop(run_worker_until_signalled(services))
    except KeyboardInterrupt:
        pass
    return 0


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop (the loop `gateway serve` runs on, through uvicorn) when it is
    installed, else on asyncio's own: a worker is mostly socket writes and reads."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - installed with uvicorn[standard]
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def cmd_migrate(args: argparse.Namespace) -> int:
    """Alembic upgrade / downgrade / current."""
    from gateway import migrate
    from gateway.runtime import prepare

    settings = _settings()
    _logging(settings)
    prepared = prepare(settings, apply_migrations=False)
    if args.action == "upgrade":
        migrate.upgrade(prepared.database_url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(prepared.database_url, args.revision or "-1")
    else:
        print(migrate.current(prepared.database_url) or "(empty database)")
    return 0


def _positive_int(value: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return number


def cmd_openapi(args: argparse.Namespace) -> int:
    """Print the OpenAPI schema as YAML."""
    from gateway.app import openapi_yaml

    sys.stdout.write(openapi_yaml())
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Create, list and revoke API keys."""
    from gateway.db import create_engine, session_factory
    from gateway.keys import (
        UnknownScopeError,
        create_key,
        key_name_problem,
        list_keys,
        parse_scopes,
        revoke_key,
    )
    from gateway.runtime import prepare

    settings = _settings()
    _logging(settings)
    if args.action == "create":
        try:
            scopes = parse_scopes(args.scopes)
        except UnknownScopeError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
        if problem := key_name_problem(args.name or ""):
            print(f"gateway: {problem}", file=sys.stderr)
            return 2
    if args.action == "revoke":
        try:
            key_id = uuid.UUID(args.id)
        except ValueError:
            print(f"gateway: not a key id: {args.id}", file=sys.stderr)
            return 2
    # Only an engine: the whole service graph (providers, Redis, web app) is not needed here.
    prepared = prepare(settings)
    engine = create_engine(prepared.database_url, pool_size=1)
    sessions = session_factory(engine)

    async def run() -> int:
        try:
            async with sessions() as session:
                if args.action == "create":
                    row, secret = await create_key(session, scopes, name=args.name or "")
                    await session.commit()
                    print(f"created key {row.id} scopes={','.join(row.scopes)}", file=sys.stderr)
                    print(secret)
                    return 0
                if args.action == "list":
                    for row in await list_keys(session):
                        state = "revoked" if row.revoked_at else "active"
                        print(
                            f"{row.id}\t{state}\t{','.join(row.scopes)}\t"
                            f"{row.created_at.isoformat()}\t{row.name}"
                        )
                    return 0
                ok = await revoke_key(session, key_id)
                await session.commit()
                if not ok:
                    print(f"gateway: no active key {key_id}", file=sys.stderr)
                    return 1
                print(f"revoked {key_id}", file=sys.stderr)
                return 0
        finally:
            await engine.dispose()

    return asyncio.run(run())


def _cli_actor() -> str:
    """How CLI changes are attributed in suppression history."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):
        return "cli:unknown"


def _iso_time(value: str) -> dt.datetime:
    """argparse type: an ISO 8601 time with a zone."""
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"needs a time zone (e.g. +00:00): {value!r}")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"time out of range: {value!r}") from None


def cmd_suppressions(args: argparse.Namespace) -> int:
    """Import, export, check, add and remove suppression entries (progress on stderr)."""
    from gateway.runtime import prepare, services_for
    from suppression import commands
    from suppression.formats import ImportOptions, UnrecognizedFormat

    settings = _settings()
    _logging(settings)
    options = None
    if args.action == "import":
        try:
            options = ImportOptions(
                args.format, args.sendgrid_list, args.unsubscribe_scope, settings.default_region
            )
        except ValueError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
    file: BinaryIO | None = None
    try:
        if args.action == "import":
            file = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
        elif args.action == "export":
            file = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")
    except OSError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    services = services_for(prepare(settings))
    context = services.suppression
    actor = _cli_actor()

    async def run() -> int:
        try:
            if args.action == "import":
                assert options is not None and file is not None
                report = await commands.import_file(
                    context, file, options, actor=actor, err=sys.stderr
                )
                commands.dump(report.as_dict(), sys.stdout)
            elif args.action == "export":
                assert file is not None
                count = await commands.export_file(
                    context, file, fmt=args.format, since=args.since, err=sys.stderr
                )
                print(f"exported {count} entries", file=sys.stderr)
            elif args.action == "check":
                addresses = args.addresses or sys.stdin
                count = await commands.check_addresses(
                    context,
                    args.channel,
                    addresses,
                    category=args.category,
                    topic=args.topic,
                    out=sys.stdout,
                    err=sys.stderr,
                )
                print(f"{count} suppressed", file=sys.stderr)
            elif args.action == "add":
                result = await commands.add_address(
                    context,
                    args.channel,
                    args.address,
                    reason=args.reason,
                    scope=args.scope,
                    expires_at=args.expires_at,
                    actor=actor,
                )
                commands.dump(result, sys.stdout)
            else:
                removed = await commands.remove_address(
                    context,
                    args.channel,
                    args.address,
                    reason=args.reason,
                    scope=args.scope,
                    force=args.force,
                    actor=actor,
                )
                commands.dump({"removed": removed}, sys.stdout)
            return 0
        except commands.CommandError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        except UnrecognizedFormat as exc:
            print(f"gateway: unrecognized import format: {exc}", file=sys.stderr)
            return 2
        finally:
            await services.close()

    try:
        return asyncio.run(run())
    finally:
        if file is not None and file not in (sys.stdin.buffer, sys.stdout.buffer):
            file.close()


def cmd_rotate_encryption(args: argparse.Namespace) -> int:
    """Re-encrypt every stored ciphertext with the newest GATEWAY_SECRET_KEYS key."""
    from gateway.runtime import prepare, services_for
    from gateway.subjects import rotate_encryption
    from suppression.progress import ProgressBar

    settings = _settings()
    _logging(settings)
    _metrics(settings, clean=False)
    services = services_for(prepare(settings))
    bars: dict[str, ProgressBar] = {}

    def progress(label: str, done: int, total: int) -> None:
        bar = bars.get(label)
        if bar is None:
            for other in bars.values():
                other.finish()
            bar = bars[label] = ProgressBar(label, total, stream=sys.stderr)
        bar.update(done, total)

    async def run() -> int:
        try:
            report = await rotate_encryption(
                services.sessions, services.protector, batch_size=args.batch_size, progress=progress
            )
        finally:
            await services.close()
        if bars:
            list(bars.values())[-1].finish()
        for label in report.rotated:
            print(
                f"{label}: {report.rotated[label]} rotated,"
                f" {report.current[label]} already current,"
                f" {report.failed[label]} undecryptable",
                file=sys.stderr,
            )
        if any(report.failed.values()):
            print(
                "gateway: some values could not be decrypted with any configured key"
                " (were old keys removed too early?); they were left unchanged",
                file=sys.stderr,
            )
            return 1
        return 0

    return asyncio.run(run())


def _suppressions_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from suppression.formats import EXPORT_FORMATS, IMPORT_FORMATS, SENDGRID_LISTS
    from suppression.normalize import CHANNELS
    from suppression.service import REASONS

    sup = sub.add_parser("suppressions", help="manage the suppression list")
    ssub = sup.add_subparsers(dest="action", required=True)
    imp = ssub.add_parser("import", help="import a CSV/JSON Lines file (ours, SES, SendGrid)")
    imp.add_argument("file", help="path, or - for stdin")
    imp.add_argument("--format", choices=IMPORT_FORMATS, default="auto")
    imp.add_argument("--sendgrid-list", choices=SENDGRID_LISTS, default=None)
    imp.add_argument("--unsubscribe-scope", default="marketing")
    exp = ssub.add_parser("export", help="export every entry with its history")
    exp.add_argument("--format", choices=EXPORT_FORMATS, default="csv")
    exp.add_argument("--since", type=_iso_time, default=None, help="ISO 8601 time with zone")
    exp.add_argument("--output", "-o", default="-", help="file, or - for stdout")
    chk = ssub.add_parser("check", help="print the suppressed ones among addresses")
    chk.add_argument("--channel", choices=CHANNELS, required=True)
    chk.add_argument("--category", choices=("transactional", "marketing"), default="marketing")
    chk.add_argument("--topic", default=None)
    chk.add_argument("addresses", nargs="*", help="addresses (default: one per line on stdin)")
    add = ssub.add_parser("add", help="suppress one address")
    add.add_argument("--channel", choices=CHANNELS, required=True)
    add.add_argument("--reason", choices=REASONS, required=True)
    add.add_argument("--scope", default="all")
    add.add_argument("--expires-at", type=_iso_time, default=None)
    add.add_argument("address")
    rem = ssub.add_parser("remove", help="remove the suppressions of one address")
    rem.add_argument("--channel", choices=CHANNELS, required=True)
    rem.add_argument("--reason", required=True, help="why (written to history)")
    rem.add_argument("--scope", default=None, help="only this scope (default: all scopes)")
    rem.add_argument("--force", action="store_true", help="needed for complaint/sms_stop")
    rem.add_argument("address")
    sup.set_defaults(func=cmd_suppressions)


def cmd_dlq(args: argparse.Namespace) -> int:
    """List, show, redrive and discard dead-letter entries (bulk redrive shows progress)."""
    from gateway.runtime import prepare, services_for
    from retry import commands
    from retry.dlq import DeadLetterFilter

    entry_id: uuid.UUID | None = None
    if getattr(args, "id", None):
        try:
            entry_id = uuid.UUID(args.id)
        except ValueError:
            print(f"gateway: not an entry id: {args.id}", file=sys.stderr)
            return 2
    bulk = args.action == "redrive" and entry_id is None
    filters = DeadLetterFilter(
        reason=getattr(args, "reason", None) if args.action != "discard" else None,
        channel=getattr(args, "channel", None),
        since=getattr(args, "since", None),
        until=getattr(args, "until", None),
        state=getattr(args, "state", "open"),
    )
    if bulk and not (
        args.all or filters.reason or filters.channel or filters.since or filters.until
    ):
        print(
            "gateway: give an entry id, or filters (--reason/--channel/--since/--until), "
            "or --all to redrive every open entry",
            file=sys.stderr,
        )
        return 2
    settings = _settings()
    _logging(settings)
    _metrics(settings, clean=False)
    services = services_for(prepare(settings))
    actor = _cli_actor()

    async def run() -> int:
        try:
            if args.action == "list":
                await commands.list_entries(
                    services.sessions,
                    services.delivery_queue,
                    filters,
                    limit=args.limit,
                    as_json=args.json,
                    out=sys.stdout,
                    err=sys.stderr,
                )
            elif args.action == "show":
                assert entry_id is not None
                await commands.show_entry(
                    services.sessions, services.delivery_queue, entry_id, out=sys.stdout
                )
            elif args.action == "redrive" and entry_id is not None:
                await commands.redrive_one(
                    services.sessions,
                    services.delivery_queue,
                    entry_id,
                    actor=actor,
                    note=args.note,
                    err=sys.stderr,
                )
            elif args.action == "redrive":
                await commands.redrive_many(
                    services.sessions,
                    services.delivery_queue,
                    filters,
                    actor=actor,
                    note=args.note,
                    err=sys.stderr,
                )
            else:
                assert entry_id is not None
                await commands.discard_entry(
                    services.sessions,
                    services.delivery_queue,
                    entry_id,
                    actor=actor,
                    reason=args.reason,
                    err=sys.stderr,
                )
            return 0
        except commands.CommandError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 1
        finally:
            await services.close()

    return asyncio.run(run())


def _dlq_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from retry.settings import CHANNELS

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--reason", default=None, help="max_attempts, expired, unknown_outcome, ...")
        p.add_argument("--channel", choices=CHANNELS, default=None)
        p.add_argument("--since", type=_iso_time, default=None, help="ISO 8601 time with zone")
        p.add_argument("--until", type=_iso_time, default=None, help="ISO 8601 time with zone")

    dlq = sub.add_parser("dlq", help="inspect and resolve the dead-letter queue")
    dsub = dlq.add_subparsers(dest="action", required=True)
    lst = dsub.add_parser("list", help="list entries, newest first")
    filters(lst)
    lst.add_argument("--state", choices=("open", "redriven", "discarded", "all"), default="open")
    lst.add_argument("--limit", type=int, default=100)
    lst.add_argument("--json", action="store_true", help="JSON Lines instead of columns")
    show = dsub.add_parser("show", help="show one entry with its attempt history (JSON)")
    show.add_argument("id")
    red = dsub.add_parser(
        "redrive", help="redrive one entry, or every open one matching filters (progress bar)"
    )
    red.add_argument("id", nargs="?", default=None)
    filters(red)
    red.add_argument("--all", action="store_true", help="every open entry (no filter)")
    red.add_argument("--note", default=None, help="kept with the entry")
    dis = dsub.add_parser("discard", help="discard one entry (kept as history)")
    dis.add_argument("id")
    dis.add_argument("--reason", required=True, help="why (kept with the entry)")
    dlq.set_defaults(func=cmd_dlq)


def cmd_report(args: argparse.Namespace) -> int:
    """`gateway report stale`: the stale report (same content as GET /v1/reports/stale)."""
    from gateway.reports import print_report, stale_report
    from gateway.runtime import prepare, services_for

    settings = _settings()
    _logging(settings)
    services = services_for(prepare(settings))
    hours = args.hours if args.hours is not None else settings.stale_report_hours

    async def run() -> int:
        try:
            report = await stale_report(services.engine, hours=hours, limit=args.limit)
        finally:
            await services.close()
        print_report(report, sys.stdout, as_json=args.json)
        return 0

    return asyncio.run(run())


def _positive_hours(value: str) -> float:
    """argparse type: a number of hours above 0."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < number <= 24 * 366:
        raise argparse.ArgumentTypeError(f"must be in (0, 8784]: {value!r}")
    return number


def _report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser("report", help="operator reports (stale deliveries and events)")
    rsub = report.add_subparsers(dest="action", required=True)
    stale = rsub.add_parser(
        "stale", help="deliveries without a final callback and parked events, past N hours"
    )
    stale.add_argument(
        "--hours", type=_positive_hours, default=None, help="default GATEWAY_STALE_REPORT_HOURS"
    )
    stale.add_argument("--limit", type=_positive_int, default=10, help="examples per part")
    stale.add_argument("--json", action="store_true", help="one JSON document instead of tables")
    report.set_defaults(func=cmd_report)


def cmd_events(args: argparse.Namespace) -> int:
    """`gateway events tail`: print the event feed as JSON Lines, following it."""
    from gateway.runtime import prepare, services_for
    from sender import events
    from suppression.db import pg_connection

    types = [t.strip() for t in args.types.split(",") if t.strip()] if args.types else None
    try:
        events.check_types(types)
        events.decode_cursor(args.after)
    except ValueError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    settings = _settings()
    _logging(settings)
    services = services_for(prepare(settings))

    async def run() -> int:
        try:
            after = args.after
            if after is None and not args.from_start:
                async with pg_connection(services.engine) as conn:
                    after = await events.current_cursor(conn)
            cursor = await events.tail(
                services.engine,
                services.protector,
                after=after,
                types=types,
                out=sys.stdout,
                follow=not args.no_follow,
                poll_seconds=args.poll_seconds,
            )
            print(f"next cursor: {cursor}", file=sys.stderr)
            return 0
        finally:
            await services.close()

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130


def _events_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser("events", help="read the outbound event feed")
    esub = ev.add_subparsers(dest="action", required=True)
    tail = esub.add_parser(
        "tail", help="print events as JSON Lines as they commit (every key's events)"
    )
    tail.add_argument("--types", default=None, help="comma separated, e.g. delivery.bounced")
    start = tail.add_mutually_exclusive_group()
    start.add_argument("--after", default=None, help="resume after this cursor")
    start.add_argument("--from-start", action="store_true", help="begin with the oldest event kept")
    tail.add_argument("--no-follow", action="store_true", help="stop at the end instead of waiting")
    tail.add_argument("--poll-seconds", type=float, default=1.0)
    ev.set_defaults(func=cmd_events)


def cmd_webhooks(args: argparse.Namespace) -> int:
    """Manage outbound webhook endpoints: list, create, disable, enable, rotate, test, replay."""
    from gateway.db import create_engine
    from gateway.outbound import build_outbound
    from gateway.runtime import prepare
    from suppression.crypto import AddressProtector
    from webhooks.outbound import commands

    settings = _settings()
    _logging(settings)
    # Only what the endpoints need (engine, protector, push client): not the whole service
    # graph with its providers and web framework.
    prepared = prepare(settings)
    engine = create_engine(prepared.database_url, pool_size=2)
    protector = AddressProtector(prepared.settings.hash_key, prepared.settings.secret_keys)
    outbound = build_outbound(prepared.settings, engine, protector)
    endpoints = outbound.endpoints

    async def run() -> int:
        try:
            if args.action == "list":
                await commands.list_endpoints(endpoints, as_json=args.json, out=sys.stdout)
            elif args.action == "create":
                events = [e.strip() for e in args.events.split(",") if e.strip()]
                await commands.create(
                    endpoints,
                    url=args.url,
                    events=events,
                    description=args.description,
                    api_key_id=args.api_key_id,
                    out=sys.stdout,
                    err=sys.stderr,
                )
            elif args.action in ("disable", "enable"):
                await commands.set_enabled(
                    endpoints, args.id, enabled=args.action == "enable", err=sys.stderr
                )
            elif args.action == "rotate":
                await commands.rotate(endpoints, args.id, out=sys.stdout, err=sys.stderr)
            elif args.action == "test":
                await commands.test(endpoints, args.id, out=sys.stdout)
            else:
                await commands.replay(endpoints, args.id, since=args.since, out=sys.stdout)
            return 0
        except commands.CommandError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return exc.status
        finally:
            await outbound.client.close()
            await engine.dispose()

    return asyncio.run(run())


def _webhooks_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wh = sub.add_parser("webhooks", help="manage outbound webhook endpoints")
    wsub = wh.add_subparsers(dest="action", required=True)
    lst = wsub.add_parser("list", help="list endpoints (id, state, events, URL, description)")
    lst.add_argument("--json", action="store_true", help="JSON Lines instead of columns")
    cr = wsub.add_parser("create", help="create an endpoint; prints its secret once on stdout")
    cr.add_argument("--url", required=True, help="https URL that receives the events")
    cr.add_argument("--events", default="*", help="comma separated event types, or * (default)")
    cr.add_argument("--description", default="")
    cr.add_argument("--api-key-id", required=True, help="whose events it receives (a key id)")
    for name, what in (
        ("disable", "disable an endpoint"),
        ("enable", "enable an endpoint (from the feed's end on)"),
        ("rotate", "rotate the signing secret; prints the new one (the old signs for 24 h)"),
        ("test", "push a ping event now and print the answer"),
    ):
        wsub.add_parser(name, help=what).add_argument("id")
    rep = wsub.add_parser("replay", help="send again every event since a time")
    rep.add_argument("id")
    rep.add_argument("--since", type=_iso_time, required=True, help="ISO 8601 time with zone")
    wh.set_defaults(func=cmd_webhooks)


# Commands whose parsers need nothing of the suppression and retry packages: for them the
# `suppressions` and `dlq` parsers are left bare, so that `gateway keys list` does not import
# phone-number and email validation just to build its argument parser.
_LIGHT_COMMANDS = frozenset({"serve", "worker", "migrate", "openapi", "keys"})


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of the `gateway` command (for `argv`: see _LIGHT_COMMANDS)."""
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API (and the retry worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="serving processes sharing the port (default 1); each runs its own retry worker",
    )
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run the retry worker alone")
    worker.set_defaults(func=cmd_worker)

    mig = sub.add_parser("migrate", help="apply or inspect database migrations")
    mig.add_argument("action", choices=["upgrade", "downgrade", "current"])
    mig.add_argument("revision", nargs="?", default=None)
    mig.set_defaults(func=cmd_migrate)

    oa = sub.add_parser("openapi", help="print the OpenAPI schema as YAML")
    oa.set_defaults(func=cmd_openapi)

    keys = sub.add_parser("keys", help="manage API keys")
    ksub = keys.add_subparsers(dest="action", required=True)
    kc = ksub.add_parser("create", help="create a key; prints the secret once on stdout")
    kc.add_argument("--scopes", required=True, help="comma separated: send,read,admin,export")
    kc.add_argument("--name", default="")
    ksub.add_parser("list", help="list keys")
    kr = ksub.add_parser("revoke", help="revoke a key by id")
    kr.add_argument("id")
    keys.set_defaults(func=cmd_keys)
    rot = ksub.add_parser(
        "rotate-encryption", help="re-encrypt every stored ciphertext with the newest key"
    )
    rot.add_argument("--batch-size", type=int, default=500)
    rot.set_defaults(func=cmd_rotate_encryption)
    _report_parser(sub)
    if argv and argv[0] in _LIGHT_COMMANDS:
        sub.add_parser("suppressions", help="manage the suppression list")
        sub.add_parser("dlq", help="inspect and resolve the dead-letter queue")
    else:
        _suppressions_parser(sub)
        _dlq_parser(sub)
    _events_parser(sub)
    _webhooks_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gateway` console script."""
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
