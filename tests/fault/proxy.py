"""A TCP proxy that the drills switch off and on: a database or Redis "outage" without
touching the real server.

`down()` stops listening (new connections are refused) and cuts every open connection, as a
network partition or a restarting server would; `up()` listens again on the same port. The
target may be a TCP address or a Unix socket (the embedded servers of the test suite).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Self

from sqlalchemy.engine import make_url


class TcpProxy:
    """Forwards 127.0.0.1:`port` to a target; runs its own event loop in a daemon thread."""

    def __init__(
        self, *, host: str | None = None, port: int | None = None, unix: str | None = None
    ):
        if unix is None and (host is None or port is None):
            raise ValueError("a TCP target (host, port) or a Unix socket is required")
        self._target = (host, port, unix)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]

    @classmethod
    def for_url(cls, url: str) -> TcpProxy:
        """A proxy for the server of a `postgresql://` or `redis://` / `unix://` URL."""
        if url.startswith("unix://"):
            return cls(unix=url.removeprefix("unix://").split("?", 1)[0])
        parsed = make_url(url)
        socket_dir = parsed.query.get("host")
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            return cls(unix=f"{socket_dir}/.s.PGSQL.{parsed.port or 5432}")
        default_port = 6379 if parsed.drivername.startswith("redis") else 5432
        return cls(host=parsed.host or "127.0.0.1", port=parsed.port or default_port)

    def proxied_url(self, url: str) -> str:
        """`url` with its server replaced by this proxy (user, password, database kept)."""
        if url.startswith(("redis://", "unix://")):
            db = "0"
            if url.startswith("redis://") and url.rstrip("/").count("/") >= 3:
                db = url.rstrip("/").rsplit("/", 1)[-1] or "0"
            elif "db=" in url:
                db = url.split("db=", 1)[1].split("&", 1)[0]
            return f"redis://127.0.0.1:{self.port}/{db}"
        parsed = make_url(url)
        query = {k: v for k, v in parsed.query.items() if k != "host"}
        return (parsed.set(host="127.0.0.1", port=self.port, query=query)).render_as_string(
            hide_password=False
        )

    # -- control (from any thread) ----------------------------------------------------------

    def start(self) -> Self:
        """Start the loop and listen."""
        self._thread.start()
        self.up()
        return self

    def up(self) -> None:
        """Listen (again) on the proxy's port."""
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    def down(self) -> None:
        """Refuse new connections and cut every open one."""
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(timeout=10)

    def close(self) -> None:
        """Cut everything and stop the loop."""
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Client connections currently open through the proxy."""
        return len(self._writers) // 2

    # -- the loop's side --------------------------------------------------------------------

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port, unix = self._target
        try:
            if unix is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
