"""`gateway serve`: the HTTP API in one process, or in N uvicorn worker processes on one port.

The parent does what must happen once, before any worker starts: it starts the embedded
PostgreSQL when no DATABASE_URL is set (keeps it running for as long as it runs, restarts it
if it dies, and stops it on every way out: see `gateway.embedded`), applies the migrations
and, on the embedded default's first start, prints an admin key.

With `--workers 1` (the default) the app then runs in that same process. With more, uvicorn
binds the port in the parent and spawns N fresh interpreters that share the socket; each one
calls `worker_app`, which builds a `Services` of its own (engine, pools, Redis client,
provider clients) in its own process, and closes it when the worker stops. The parent hands
the resolved database URL to them in `WORKER_DATABASE_URL_ENV` (the embedded server's URL is
only known once it runs); everything else they read from the same environment the parent did.

Background work: each worker process runs its own retry worker (when GATEWAY_WORKER_ENABLED),
as N `gateway worker` processes would. That is safe (due deliveries are claimed with
`FOR UPDATE SKIP LOCKED`, each by exactly one worker) and lets retry throughput grow with the
processes; rate limits and circuit breakers are only shared between processes through Redis,
so without REDIS_URL each process applies the configured rates on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys

from litestar import Litestar

from gateway.embedded import (
    EXIT_DATABASE_LOST,
    EmbeddedServer,
    server_for,
    stop_on_signals,
    terminate_self,
)
from gateway.runtime import (
    Prepared,
    adopt,
    configure_logging,
    prepare,
    services_for,
    startup_summary,
)
from gateway.settings import Settings, load_settings, serving_public_url

log = logging.getLogger("gateway")

WORKER_DATABASE_URL_ENV = "GATEWAY_SERVE_DATABASE_URL"
"""Set by the parent for its workers: the database they connect to (not a user setting)."""

# A worker answers the parent's liveness pings only once its interpreter has imported its
# modules; on a loaded machine that can take more than uvicorn's default 5 s.
WORKER_HEALTHCHECK_SECONDS = 20


def serve(settings: Settings, *, host: str, port: int, workers: int = 1) -> int:
    """Prepare once, then serve on `host:port` with `workers` processes until signalled.

    The embedded PostgreSQL (no DATABASE_URL) is stopped on every way out: SIGTERM, SIGINT,
    an exception. While serving, it is watched: restarted if it dies, and if it cannot be,
    the gateway stops with exit status `EXIT_DATABASE_LOST` (see `gateway.embedded`)."""
    public_url = serving_public_url(settings, host, port)
    if public_url != settings.public_url:
        settings = dataclasses.replace(settings, public_url=public_url)
        # The workers of `--workers N` read their settings from this environment again.
        os.environ["GATEWAY_PUBLIC_URL"] = public_url
    embedded: EmbeddedServer | None = None

    def exit_status() -> int:
        return EXIT_DATABASE_LOST if embedded is not None and embedded.gave_up else 0

    with stop_on_signals(exit_status):
        try:
            prepared = prepare(settings)
            for line in startup_summary(prepared, listen=f"http://{_host_in_url(host)}:{port}"):
                log.info("%s", line)
            if prepared.settings.embedded_database:
                embedded = server_for(prepared.settings.data_dir)
                if embedded is not None:
                    embedded.watch(on_give_up=terminate_self)
                asyncio.run(_print_first_admin_key(prepared))
            _run_uvicorn(prepared, settings, host=host, port=port, workers=workers)
        finally:
            if embedded is None and settings.embedded_database:
                embedded = server_for(settings.data_dir)  # interrupted while preparing
            if embedded is not None:
                embedded.stop()
    return exit_status()


def _run_uvicorn(
    prepared: Prepared, settings: Settings, *, host: str, port: int, workers: int
) -> None:
    import uvicorn

    log_level = settings.log_level.lower()
    if workers <= 1:
        # uvicorn handles SIGTERM/SIGINT while it runs, then raises the signal again: the
        # handlers of `stop_on_signals` turn that into SystemExit, so `serve` can clean up.
        uvicorn.run(
            app_for(prepared),
            host=host,
            port=port,
            log_level=log_level,
            # uvicorn's lines go through the gateway's handler (gateway.logs); its access log
            # is replaced by the gateway's own (route templates: a path may hold an address).
            log_config=None,
            access_log=False,
        )
        return
    if settings.redis_url is None:
        log.warning(
            "serving with %d worker processes without REDIS_URL: rate limits and circuit "
            "breakers are per process (each applies the configured rates on its own)",
            workers,
        )
    # Inherited by the spawned workers (uvicorn starts them with multiprocessing's "spawn").
    os.environ[WORKER_DATABASE_URL_ENV] = prepared.database_url
    uvicorn.run(
        f"{__name__}:worker_app",
        factory=True,
        workers=workers,
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
    )


def app_for(prepared: Prepared) -> Litestar:
    """The app of one serving process, with services of its own and its background tasks."""
    from gateway.app import create_app
    from gateway.worker import background_tasks

    services = services_for(prepared)
    background = list(background_tasks(prepared.settings, in_server=True))
    return create_app(services, background=background, owns_services=True)


def worker_app() -> Litestar:
    """uvicorn's app factory in each worker process of `serve --workers N`."""
    settings = load_settings()  # the parent's environment, validated there already
    configure_logging(settings)
    database_url = os.environ.get(WORKER_DATABASE_URL_ENV) or settings.database_url
    if database_url is None:
        raise RuntimeError(f"{WORKER_DATABASE_URL_ENV} is not set: start `gateway serve`")
    log.info("worker process %d serving", os.getpid())
    return app_for(adopt(settings, database_url))


async def _print_first_admin_key(prepared: Prepared) -> None:
    """The first start of the embedded default prints an admin key, once (in the parent)."""
    from gateway.runtime import ensure_first_admin_key

    # Services of a short-lived loop of their own: the serving processes build theirs.
    services = services_for(prepared)
    try:
        secret = await ensure_first_admin_key(services)
    finally:
        await services.close()
    if secret:
        print(
            admin_key_box(secret, base_url=prepared.settings.public_url),
            file=sys.stderr,
            flush=True,
        )


def admin_key_box(secret: str, *, base_url: str) -> str:
    """The first start's admin key in a box that says what it is and how to use it."""
    lines = [
        "ADMIN API KEY (all scopes), shown once: only its hash is stored.",
        "Keep it, and use it in this shell with:",
        "",
        f"    export KEY={secret}",
        f'    curl -s -H "Authorization: Bearer $KEY" {base_url}/v1/keys',
        "",
        "Another key: gateway keys create --scopes send,read (./dev keys create ...)",
    ]
    width = max(len(line) for line in lines)
    border = "+" + "-" * (width + 2) + "+"
    body = [f"| {line.ljust(width)} |" for line in lines]
    return "\n".join([border, *body, border])


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
