"""The `gateway` command: serve, worker, migrate, openapi, keys."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from gateway.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from gateway.services import Services

log = logging.getLogger("gateway")


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the HTTP server (and the retry worker unless disabled)."""
    import uvicorn

    from gateway.app import create_app
    from gateway.runtime import prepare, services_for

    settings = _settings()
    _logging(settings)
    prepared = prepare(settings)
    services = services_for(prepared)
    if prepared.settings.embedded_database:
        asyncio.run(_print_first_admin_key(services))
    app = create_app(services, background=_background(prepared.settings))
    uvicorn.run(app, host=args.host, port=args.port, log_level=settings.log_level.lower())
    return 0


async def _print_first_admin_key(services: Services) -> None:
    """The first start of the embedded default prints an admin key, once."""
    from gateway.runtime import ensure_first_admin_key

    try:
        secret = await ensure_first_admin_key(services)
    finally:
        # The pool belongs to this short-lived loop; uvicorn runs the app on another one.
        await services.engine.dispose()
    if secret:
        print(f"Admin API key (shown once, keep it): {secret}", flush=True)


def _background(settings: Settings) -> list[Callable[[Services], Awaitable[None]]]:
    from gateway.worker import background_tasks

    return list(background_tasks(settings, in_server=True))


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the retry worker alone (any number may run side by side)."""
    from gateway.runtime import prepare, services_for
    from gateway.worker import run_worker

    settings = _settings()
    _logging(settings)
    services = services_for(prepare(settings))
    try:
        asyncio.run(run_worker(services))
    except KeyboardInterrupt:
        pass
    return 0


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


def cmd_openapi(args: argparse.Namespace) -> int:
    """Print the OpenAPI schema as YAML."""
    from gateway.app import openapi_yaml

    sys.stdout.write(openapi_yaml())
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Create, list and revoke API keys."""
    from gateway.keys import UnknownScopeError, create_key, list_keys, parse_scopes, revoke_key
    from gateway.runtime import prepare, services_for

    settings = _settings()
    _logging(settings)
    if args.action == "create":
        try:
            scopes = parse_scopes(args.scopes)
        except UnknownScopeError as exc:
            print(f"gateway: {exc}", file=sys.stderr)
            return 2
    if args.action == "revoke":
        try:
            key_id = uuid.UUID(args.id)
        except ValueError:
            print(f"gateway: not a key id: {args.id}", file=sys.stderr)
            return 2
    services = services_for(prepare(settings))

    async def run() -> int:
        try:
            async with services.sessions() as session:
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
            await services.close()

    return asyncio.run(run())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `gateway` command."""
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API (and the retry worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gateway` console script."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
