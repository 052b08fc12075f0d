"""Load generation for the bench runner: wrk (with a generated Lua script) or a Python driver.

A `LoadSpec` says what to send. Two modes:

* ``template``: every request is built from `path`, `headers` and `body`, in which
  ``@U@`` becomes a token unique to the request (run nonce, thread, counter) and ``@P@`` four
  digits cycling with the counter (for phone numbers). Used for sends (each its own
  Idempotency-Key) and checks.
* ``file``: raw, pre-rendered HTTP requests (e.g. signed callbacks) separated by `SEPARATOR`;
  each wrk thread / driver connection cycles through its share of them.

`run_load(spec)` uses wrk when it is on PATH (installing Debian's package once when running
as root), else the asyncio driver of this module in a subprocess
(``python -m benchmarks.load SPEC.json``), which also serves fixed-count runs
(`LoadSpec.count`). Both report a `LoadResult` (requests, seconds, errors, latency
percentiles in milliseconds).
"""

# ruff: noqa: S603, S607  (runs wrk, apt-get and its own driver)

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

SEPARATOR = b"\n\x00\x00\n"

_tool: dict[str, str | None] = {}


@dataclass
class LoadSpec:
    """What to send, how hard and for how long (or how many requests: `count`, within
    `duration` seconds at most)."""

    base: str
    mode: str = "template"
    method: str = "POST"
    path: str = "/"
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    file: str = ""
    connections: int = 16
    duration: float = 10.0
    count: int | None = None
    nonce: str = "n"
    force_python: bool = False


@dataclass
class LoadResult:
    """What a load run measured (latencies in milliseconds)."""

    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    tool: str
    # Python driver only: how many answers of each error status ("503": 12).
    error_statuses: dict[str, int] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def render(template: str, unique: str, counter: int) -> str:
    """Fill the placeholders of a template (see the module docstring)."""
    return template.replace("@U@", unique).replace("@P@", f"{counter % 10000:04d}")


def raw_request(base: str, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """One HTTP/1.1 request as bytes (Host and Content-Length added)."""
    host = urlsplit(base).netloc
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def write_request_file(path: Path, requests: list[bytes]) -> None:
    """Write pre-rendered requests for `LoadSpec(mode="file")`."""
    with path.open("wb") as out:
        out.write(SEPARATOR.join(requests))


def module_command(module: str) -> list[str]:
    """`python -m module`, written so that the command line does not name the module.

    On a shared machine a careless ``pkill -f benchmarks`` (someone else's clean-up) would
    otherwise stop this run's helpers half-way.
    """
    code = "import runpy, sys; runpy.run_module(sys.argv.pop(1)[::-1], run_name='__main__')"
    return [sys.executable, "-c", code, module[::-1]]


def wrk_path() -> str | None:
    """wrk on PATH; when missing and running as root, try `apt-get install -y wrk` once."""
    if "wrk" in _tool:
        return _tool["wrk"]
    found = shutil.which("wrk")
    if found is None and os.environ.get("BENCH_NO_WRK_INSTALL") != "1" and os.geteuid() == 0:
        print("bench: wrk missing, trying apt-get install -y wrk", file=sys.stderr)
        for cmd in (["apt-get", "install", "-y", "wrk"], ["apt-get", "update"]):
            subprocess.run(cmd, capture_output=True, timeout=300, check=False)
            found = shutil.which("wrk")
            if found:
                break
        if found is None:
            subprocess.run(
                ["apt-get", "install", "-y", "wrk"], capture_output=True, timeout=300, check=False
            )
            found = shutil.which("wrk")
    _tool["wrk"] = found
    return found


def _lua_string(value: str | bytes) -> str:
    data = value.encode() if isinstance(value, str) else value
    return '"' + "".join(f"\\{b:03d}" for b in data) + '"'


_LUA_COMMON = """
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"errors":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
"""


def lua_script(spec: LoadSpec, threads: int) -> str:
    """The wrk script for `spec` (threads: wrk's -t, to split the request file)."""
    if spec.mode == "file":
        return (
            _LUA_COMMON
            + f"""
local sep = {_lua_string(SEPARATOR)}
function init(args)
  local f = assert(io.open({_lua_string(spec.file)}, "rb"))
  local data = f:read("*a")
  f:close()
  reqs = {{}}
  local start, i = 1, 0
  while true do
    local s, e = string.find(data, sep, start, true)
    local piece = s and string.sub(data, start, s - 1) or string.sub(data, start)
    if i % {threads} == tid then table.insert(reqs, piece) end
    i = i + 1
    if not s then break end
    start = e + 1
  end
  idx = 0
end
function request()
  idx = idx + 1
  if idx > #reqs then idx = 1 end
  return reqs[idx]
end
"""
        )
    headers = (
        "{"
        + ",".join(f"[{_lua_string(k)}]={_lua_string(v)}" for k, v in spec.headers.items())
        + "}"
    )
    return (
        _LUA_COMMON
        + f"""
local method = {_lua_string(spec.method)}
local path = {_lua_string(spec.path)}
local headers = {headers}
local body = {_lua_string(spec.body)}
local nonce = {_lua_string(spec.nonce)}
function init(args)
  counter = 0
end
local function fill(s, u, p)
  s = string.gsub(s, "@U@", u)
  s = string.gsub(s, "@P@", p)
  return s
end
function request()
  counter = counter + 1
  local u = nonce .. "-" .. tid .. "-" .. counter
  local p = string.format("%04d", (counter * {threads} + tid) % 10000)
  local h = {{}}
  for k, v in pairs(headers) do h[k] = fill(v, u, p) end
  return wrk.format(method, fill(path, u, p), h, fill(body, u, p))
end
"""
    )


def _run_wrk(wrk: str, spec: LoadSpec) -> LoadResult:
    threads = max(1, min(2, spec.connections))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(lua_script(spec, threads))
    try:
        cmd = [
            wrk,
            f"-t{threads}",
            f"-c{spec.connections}",
            f"-d{max(1, round(spec.duration))}s",
            "--timeout",
            "30s",
            "-s",
            script.name,
            spec.base,
        ]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=spec.duration + 120, check=False
        )
    finally:
        os.unlink(script.name)
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            data = json.loads(line[len("WRKJSON ") :])
            return LoadResult(
                requests=data["requests"],
                seconds=data["duration_us"] / 1e6,
                errors=data["errors"],
                p50_ms=data["p50_us"] / 1000,
                p90_ms=data["p90_us"] / 1000,
                p99_ms=data["p99_us"] / 1000,
                tool="wrk",
            )
    raise RuntimeError(f"wrk gave no result: {done.stdout[-500:]} {done.stderr[-500:]}")


def run_load(spec: LoadSpec) -> LoadResult:
    """Run `spec` with wrk, or with the Python driver when wrk is unavailable or a count is set."""
    wrk = None if (spec.force_python or spec.count is not None) else wrk_path()
    if wrk is not None:
        return _run_wrk(wrk, spec)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(asdict(spec), f)
    try:
        timeout = spec.duration + 120
        done = subprocess.run(
            [*module_command("benchmarks.load"), f.name],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise RuntimeError(f"load driver failed: {done.stderr[-1500:]}")
    return LoadResult(**json.loads(done.stdout.strip().splitlines()[-1]))


# -- the asyncio driver (run in its own process) ---------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(value.strip())
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


def _read_requests(path: str) -> list[bytes]:
    return Path(path).read_bytes().split(SEPARATOR)


async def _drive(spec: LoadSpec) -> LoadResult:
    parts = urlsplit(spec.base)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    file_reqs: list[bytes] = []
    if spec.mode == "file":
        file_reqs = _read_requests(spec.file)
    latencies: list[float] = []
    error_statuses: dict[str, int] = {}
    errors = 0
    issued = 0
    deadline = time.perf_counter() + spec.duration

    def next_request(conn: int, n: int) -> bytes:
        if spec.mode == "file":
            mine = file_reqs[conn :: spec.connections] or file_reqs
            return mine[n % len(mine)]
        unique = f"{spec.nonce}-{conn}-{n}"
        counter = n * spec.connections + conn
        headers = {k: render(v, unique, counter) for k, v in spec.headers.items()}
        body = render(spec.body, unique, counter).encode()
        path = render(spec.path, unique, counter)
        return raw_request(spec.base, spec.method, path, headers, body)

    async def connection(conn: int) -> None:
        nonlocal errors, issued
        reader, writer = await asyncio.open_connection(host, port)
        n = 0
        try:
            while True:
                if time.perf_counter() >= deadline:
                    return
                if spec.count is not None:
                    if issued >= spec.count:
                        return
                    issued += 1
                data = next_request(conn, n)
                n += 1
                start = time.perf_counter()
                writer.write(data)
                status = await _read_response(reader)
                latencies.append(time.perf_counter() - start)
                if status >= 400:
                    errors += 1
                    error_statuses[str(status)] = error_statuses.get(str(status), 0) + 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(connection(c) for c in range(spec.connections)))
    seconds = time.perf_counter() - start
    ordered = sorted(latencies) or [0.0]

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000

    return LoadResult(
        len(latencies), seconds, errors, pct(0.5), pct(0.9), pct(0.99), "python", error_statuses
    )


def main() -> None:
    spec = LoadSpec(**json.loads(Path(sys.argv[1]).read_text()))
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    result = asyncio.run(_drive(spec))
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
