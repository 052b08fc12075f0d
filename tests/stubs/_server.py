"""A tiny threaded HTTP server with programmable behaviours, shared by the provider stubs.

Each request is answered by a `Behavior`: taken from the per-recipient table if one matches,
else from that recipient's own queue of scripted behaviours (`then_to`), else from the shared
queue (`then`), else the default (accept). Every request is recorded as a `Call` with the
monotonic time it arrived. Behaviours:

* `accept` — the provider takes the message (counted in `accepted`) and answers success;
  `hold` (a `threading.Event`) keeps the answer back until it is set; `after_accept` runs
  after the message is recorded and before the answer is written (e.g. to kill the caller).
* `error` — an HTTP error answer with a provider error code and optional headers.
* `drop` — the provider takes the message, then the connection is closed without an answer
  (the client sees a dropped connection after its request went out).
* `hang` — the provider never answers and never takes the message: the connection is held
  until `hold` is set (at most 30 s), then closed (the client's read timeout fires first).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self


@dataclass
class Behavior:
    """How the stub answers one request."""

    kind: str = "accept"
    status: int = 400
    code: str | int | None = None
    message: str = "error"
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    after_accept: Callable[[], None] | None = None

    @classmethod
    def accept(cls, **kw: Any) -> Behavior:
        return cls("accept", **kw)

    @classmethod
    def error(
        cls, status: int, code: str | int | None, message: str = "error", **kw: Any
    ) -> Behavior:
        return cls("error", status=status, code=code, message=message, **kw)

    @classmethod
    def drop(cls) -> Behavior:
        return cls("drop")

    @classmethod
    def hang(cls, hold: threading.Event) -> Behavior:
        return cls("hang", hold=hold)


@dataclass
class Call:
    """One request the stub received."""

    path: str
    headers: dict[str, str]
    body: Any
    recipient: str | None
    behavior: str
    at: float
    """`time.monotonic()` when the request arrived."""


class _Server(ThreadingHTTPServer):
    # Many workers may connect at once: a deeper accept queue than the default 5.
    request_queue_size = 256
    daemon_threads = True


class StubServer:
    """Base class: subclasses parse requests and format answers for their provider."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.accepted: list[dict[str, Any]] = []
        self.script: deque[Behavior] = deque()
        self.by_recipient: dict[str, Behavior] = {}
        self.recipient_script: dict[str, deque[Behavior]] = {}
        self.received = threading.Event()
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if len(raw) < length:
                    # The client died mid-request (the kill -9 drill): like a real provider,
                    # a truncated request is not a message.
                    self.close_connection = True
                    return
                stub._handle(self, raw)

            def do_GET(self) -> None:
                self._send(404, {"message": "not found"}, {})

            def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._handler_cls = Handler
        self.server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- subclass hooks ---------------------------------------------------------------------

    def parse(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[Any, str | None]:
        """(parsed body, recipient) of a request."""
        raise NotImplementedError

    def success(self, body: Any) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """(status, answer, record) for an accepted message."""
        raise NotImplementedError

    def failure(self, behavior: Behavior) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, answer, headers) for an error behaviour."""
        raise NotImplementedError

    def check(self, path: str, headers: dict[str, str]) -> Behavior | None:
        """An error behaviour for a request the provider would refuse outright (auth, path)."""
        return None

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        queued = [b for q in self.recipient_script.values() for b in q]
        for behavior in [*self.script, *queued, *self.by_recipient.values()]:
            if behavior.hold is not None:
                behavior.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def then(self, *behaviors: Behavior) -> None:
        """Script the answers to the next requests, in order."""
        self.script.extend(behaviors)

    def then_to(self, recipient: str, *behaviors: Behavior) -> None:
        """Script the answers to the next requests for `recipient`, in order (replacing what
        is left of its script; no behaviours clears it)."""
        with self._lock:
            self.recipient_script[recipient] = deque(behaviors)

    @property
    def count(self) -> int:
        """How many requests reached the stub."""
        return len(self.calls)

    def calls_to(self, recipient: str) -> list[Call]:
        """The requests for `recipient`, in arrival order."""
        with self._lock:
            return [c for c in self.calls if c.recipient == recipient]

    def _pick(self, recipient: str | None) -> Behavior:
        with self._lock:
            if recipient is not None and recipient in self.by_recipient:
                return self.by_recipient[recipient]
            own = self.recipient_script.get(recipient) if recipient is not None else None
            if own:
                return own.popleft()
            if self.script:
                return self.script.popleft()
        return Behavior.accept()

    def _handle(self, handler: Any, raw: bytes) -> None:
        at = time.monotonic()
        headers = {k.lower(): v for k, v in handler.headers.items()}
        body, recipient = self.parse(handler.path, headers, raw)
        refused = self.check(handler.path, headers)
        behavior = refused or self._pick(recipient)
        with self._lock:
            self.calls.append(Call(handler.path, headers, body, recipient, behavior.kind, at))
        self.received.set()
        if behavior.kind == "hang":
            if behavior.hold is not None:
                behavior.hold.wait(timeout=30)
            handler.close_connection = True
            return
        if behavior.kind == "error":
            status, answer, extra = self.failure(behavior)
            handler._send(status, answer, {**extra, **behavior.headers})
            return
        status, answer, record = self.success(body)
        with self._lock:
            self.accepted.append(record)
        if behavior.after_accept is not None:
            behavior.after_accept()
        if behavior.kind == "drop":
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if behavior.hold is not None:
            behavior.hold.wait(timeout=30)
        try:
            handler._send(status, answer, {})
        except OSError:
            pass
