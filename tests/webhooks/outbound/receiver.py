"""A local webhook receiver for the push tests: HTTPS with a certificate of a test CA made
here with `cryptography` (or plain HTTP), answering from a script, recording every request
and verifying every signature with the `standardwebhooks` verifier.

Each request is recorded as a `Received` (headers, body, `webhook-id`, and which of the
receiver's known secrets produced a valid signature). Answers come from `script` (a queue of
status codes, or `HANG` to hold the request until `release` is set), else `default_status`.
"""

from __future__ import annotations

import datetime as dt
import json
import ssl
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

HANG = -1


@dataclass
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: str
    # The secrets (of `Receiver.secrets`) whose signature the request carries, verified.
    verified_by: list[str]

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed

    @property
    def signatures(self) -> list[str]:
        return self.headers["webhook-signature"].split(" ")


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A test CA and a server certificate it signed for `localhost`; returns
    (CA bundle, server certificate, server key) PEM paths."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            # The name only, no IP address: a push that connects to 127.0.0.1 passes the
            # certificate check only if TLS is done under the URL's name (SNI), as it must.
            x509.SubjectAlternativeName([x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = directory / "ca.pem"
    cert_path = directory / "server.pem"
    key_path = directory / "server.key"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64


class Receiver:
    """A webhook receiver on 127.0.0.1 (HTTPS when given a certificate and key)."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[Received] = []
        self.secrets: list[str] = []
        self.script: deque[int] = deque()
        self.default_status = 200
        self.release = threading.Event()
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                status = receiver._record(self.path, dict(self.headers.items()), body)
                if status == HANG:
                    receiver.release.wait(30)
                    self.close_connection = True
                    return
                data = b'{"ok":true}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            # The handshake happens in the request's own thread, not in the accepting one.
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, path: str = "/hook", host: str = "localhost") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def _record(self, path: str, headers: dict[str, str], body: str) -> int:
        lowered = {k.lower(): v for k, v in headers.items()}
        verified = []
        for secret in list(self.secrets):
            try:
                Webhook(secret).verify(body, lowered)
            except WebhookVerificationError:
                continue
            verified.append(secret)
        with self.arrived:
            self.requests.append(Received(path, lowered, body, verified))
            status = self.script.popleft() if self.script else self.default_status
            self.arrived.notify_all()
        return status

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        """Block until `count` requests have arrived (a guard against hanging: fails after
        `timeout` seconds)."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"{len(self.requests)} of {count} requests arrived")
            return list(self.requests)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
