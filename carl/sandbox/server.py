"""The environment server: many sandboxes behind HTTP, for remote rollout workers.

    rollout worker                          carl env serve (this module)
    RemoteSandbox ---- POST /v1/sandboxes ---> BearerGate: token, then the body read under a size cap
         |                                     open_sandbox(copy of a server path or upload)
         |        ---- POST .../{id}/exec ---> sandbox.exec(...)         (thread pool)
         |        ---- read/write/list ------> sandbox.read_file(...)
    heartbeat thread -- POST .../heartbeat --> last_seen = now           (event loop, cheap)
         |        ---- DELETE .../{id} ------> sandbox.close()
                                             reaper thread: close sandboxes whose last_seen is
                                             older than ttl_s and that run no request

Every request but GET /v1/health needs `Authorization: Bearer <token>`; the check runs before a
byte of the body is read. Whoever holds the token runs arbitrary code in sandboxes and can copy
any path the server can read into one: the token is full trust, keep the server on a private
network. Every field of every request is checked for its type and range before it is used.

Errors are JSON {"kind", "message"}; the client turns "path" into SandboxPathError and the rest
into SandboxError:

    400 request     a malformed body or query: not JSON, not an object, a field missing, of the
                    wrong type or out of range, invalid base64 (the message names the field, the
                    value and what was expected)
    400 path        a path that leaves the workspace or does not exist (SandboxPathError)
    401 auth        missing or wrong bearer token (the body is never read)
    404 not_found   unknown sandbox id (closed, reaped, never made)
    413 too_large   a body over max_request_mb (max_upload_mb for uploads); refused while reading
    429 capacity    max_sandboxes are open
    500 sandbox     the sandbox failed (SandboxError)
    500 internal    a bug in the server
"""

import base64
import dataclasses
import hmac
import io
import json
import math
import secrets
import tarfile
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from carl.sandbox.base import SandboxConfig, SandboxError, SandboxPathError
from carl.sandbox.gate import BearerGate
from carl.sandbox.host import sweep_leftovers
from carl.sandbox.scratch import Scratch, sweep_stale

CLIENT_FIELDS = ("timeout_s", "memory_mb", "cpu_s", "cpus", "max_procs", "disk_mb", "max_file_bytes",
                 "max_output_bytes", "network", "python_env", "ro_binds", "env")  # fmt: skip
"""SandboxConfig fields a client may set per sandbox; the backend is the server's."""
HEALTH_PATH = "/v1/health"
UPLOAD_PATH = "/v1/sandboxes/upload"
UPLOAD_PREFIX = "carl-upload-"
"""Upload staging directories in the temp dir (swept at start when their server was killed)."""


@dataclass(frozen=True)
class ServerConfig:
    token: str
    """Bearer token every request must carry (required; there is no tokenless mode)."""
    max_sandboxes: int = 64
    """Most sandboxes open at once; creating one more gets HTTP 429."""
    ttl_s: float = 300.0
    """A sandbox whose client sent nothing (heartbeats included) for this long is closed."""
    max_upload_mb: int = 512
    """Largest accepted tar.gz upload of a source directory, in MiB (HTTP 413 beyond)."""
    max_request_mb: int = 64
    """Largest accepted body of every other request, in MiB (HTTP 413 beyond). write_file sends
    its data base64-encoded (4/3 of its size): 64 MiB takes a file of max_file_bytes (32 MiB)."""
    max_timeout_s: float = 3600.0
    """Longest time limit a client may ask for: an exec's timeout_s or a sandbox's (HTTP 400
    beyond). Bounds how long one request can hold a thread and keep its sandbox from the reaper."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Defaults for the sandboxes; its backend ("bwrap" or "local") is what the server runs."""

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("env.token: empty; the server runs arbitrary code and needs a token")
        for name in ("max_sandboxes", "ttl_s", "max_upload_mb", "max_request_mb", "max_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"env.{name}: got {getattr(self, name)!r}, expected a positive number")
        if self.sandbox.backend == "remote":
            raise ValueError("env.sandbox.backend: a server cannot use the remote backend")


@dataclass
class _Entry:
    sandbox: object
    last_seen: float
    in_flight: int = 0


class SandboxPool:
    """Open sandboxes by id, with the cap and the TTL reaper; the HTTP layer is a thin shell on it."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self._entries: dict[str, _Entry] = {}
        self._reserved = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="carl-env-reaper", daemon=True)

    def start(self) -> None:
        self._reaper.start()

    def create(self, source: Path, config: SandboxConfig) -> tuple[str, object]:
        from carl.sandbox import open_sandbox

        with self._lock:
            if len(self._entries) + self._reserved >= self.config.max_sandboxes:
                raise _Capacity(f"server is at max_sandboxes={self.config.max_sandboxes}; close one first")
            self._reserved += 1
        try:
            sandbox = open_sandbox(source, config)
        finally:
            with self._lock:
                self._reserved -= 1
        sandbox_id = secrets.token_hex(8)
        with self._lock:
            self._entries[sandbox_id] = _Entry(sandbox, time.monotonic())
        return sandbox_id, sandbox

    def touch(self, sandbox_id: str) -> None:
        with self._lock:
            self._get(sandbox_id).last_seen = time.monotonic()

    def use(self, sandbox_id: str):
        """Context manager: the sandbox, marked busy (never reaped) while the request runs."""
        return _InUse(self, sandbox_id)

    def close(self, sandbox_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(sandbox_id, None)
        if entry is None:
            raise _NotFound(f"no sandbox {sandbox_id!r} (closed, reaped after ttl_s, or never made)")
        entry.sandbox.close()

    def close_all(self) -> None:
        self._stop.set()
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            entry.sandbox.close()

    def count(self) -> int:
        with self._lock:
            return len(self._entries)

    def reap_expired(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            expired = [
                sid
                for sid, e in self._entries.items()
                if e.in_flight == 0 and now - e.last_seen > self.config.ttl_s
            ]
            entries = [self._entries.pop(sid) for sid in expired]
        for entry in entries:
            entry.sandbox.close()
        return expired

    def _reap_loop(self) -> None:
        period_s = min(self.config.ttl_s / 4, 5.0)
        while not self._stop.wait(period_s):
            self.reap_expired()

    def _get(self, sandbox_id: str) -> _Entry:
        entry = self._entries.get(sandbox_id)
        if entry is None:
            raise _NotFound(f"no sandbox {sandbox_id!r} (closed, reaped after ttl_s, or never made)")
        return entry


class _InUse:
    def __init__(self, pool: SandboxPool, sandbox_id: str):
        self.pool, self.sandbox_id = pool, sandbox_id

    def __enter__(self):
        with self.pool._lock:
            entry = self.pool._get(self.sandbox_id)
            entry.in_flight += 1
            entry.last_seen = time.monotonic()
        self.entry = entry
        return entry.sandbox

    def __exit__(self, *exc) -> None:
        with self.pool._lock:
            self.entry.in_flight -= 1
            self.entry.last_seen = time.monotonic()


class _Capacity(Exception):
    pass


class _NotFound(Exception):
    pass


def create_app(config: ServerConfig):
    """The FastAPI app behind BearerGate (imports FastAPI lazily so that `carl --help` stays fast)."""
    from contextlib import asynccontextmanager

    import anyio.to_thread
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse

    pool = SandboxPool(config)

    @asynccontextmanager
    async def lifespan(app):
        # Blocking endpoints share one thread pool: let every sandbox run one exec at once.
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, 2 * config.max_sandboxes)
        # What a killed server left: its staging directories, and its sandboxes' copies, quota
        # mounts, cgroups and uid lock files (cleaned now, not when the first sandbox opens).
        sweep_stale(UPLOAD_PREFIX, Path(tempfile.gettempdir()))
        if config.sandbox.backend != "local":
            sweep_leftovers(config.sandbox)
        pool.start()
        yield
        pool.close_all()

    app = FastAPI(title="carl environment server", lifespan=lifespan)
    app.state.pool = pool

    def error(status: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"kind": kind, "message": message})

    @app.exception_handler(_NotFound)
    async def on_not_found(request, exc):
        return error(404, "not_found", str(exc))

    @app.exception_handler(_Capacity)
    async def on_capacity(request, exc):
        return error(429, "capacity", str(exc))

    @app.exception_handler(SandboxPathError)
    async def on_path(request, exc):
        return error(400, "path", str(exc))

    @app.exception_handler(ValueError)
    async def on_value(request, exc):
        return error(400, "request", str(exc))

    @app.exception_handler(SandboxError)
    async def on_sandbox(request, exc):
        return error(500, "sandbox", str(exc))

    @app.exception_handler(Exception)
    async def on_bug(request, exc):  # still logged with its traceback by the server
        return error(500, "internal", f"{type(exc).__name__}: {exc}")

    async def json_body(request: Request) -> dict:
        """The body as a JSON object (the gate has already read it, under the size cap)."""
        try:
            body = json.loads(await request.body())
        except ValueError as e:  # not UTF-8, or not JSON
            raise ValueError(f"request body: not valid JSON ({e}); expected a JSON object") from None
        if not isinstance(body, dict):
            raise _bad("request body", body, "a JSON object")
        return body

    @app.get(HEALTH_PATH)
    async def health():
        return {"ok": True}

    @app.post("/v1/sandboxes")
    def create_from_path(body: dict = Depends(json_body)):
        source = _field(body, "source_path", "a directory on the server", lambda v: isinstance(v, str))
        sandbox_config = _client_config(config, _field(body, "config", "a JSON object", _is_object, {}))
        if not Path(source).is_dir():
            raise SandboxPathError(f"source_path {source!r} is not a directory on the server")
        sandbox_id, sandbox = pool.create(Path(source), sandbox_config)
        return {"id": sandbox_id, "workdir": sandbox.workdir, "ttl_s": config.ttl_s}

    @app.post(UPLOAD_PATH)
    async def create_from_upload(request: Request):
        raw = request.query_params.get("config", "{}")
        try:
            overrides = json.loads(raw)
        except ValueError:
            raise _bad("config", raw, "a JSON object of SandboxConfig fields") from None
        sandbox_config = _client_config(config, overrides)
        data = await request.body()
        sandbox_id, sandbox = await anyio.to_thread.run_sync(_create_from_tar, pool, data, sandbox_config)
        return {"id": sandbox_id, "workdir": sandbox.workdir, "ttl_s": config.ttl_s}

    @app.post("/v1/sandboxes/{sandbox_id}/exec")
    def exec_(sandbox_id: str, body: dict = Depends(json_body)):
        command = _field(body, "command", "a string or a non-empty list of strings", _is_command)
        timeout_s = _field(
            body, "timeout_s", f"null or seconds in (0, {config.max_timeout_s:g}]",
            lambda v: v is None or _is_number(v) and 0 < v <= config.max_timeout_s, None,
        )  # fmt: skip
        cwd = _field(body, "cwd", "a path string", lambda v: isinstance(v, str), ".")
        env = _field(
            body, "env", "null or a JSON object of string values",
            lambda v: v is None or _is_object(v) and all(isinstance(x, str) for x in v.values()), None,
        )  # fmt: skip
        stdin = _field(body, "stdin", "null or a string", lambda v: v is None or isinstance(v, str), None)
        with pool.use(sandbox_id) as sandbox:
            res = sandbox.exec(command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin)
        return dataclasses.asdict(res)

    @app.post("/v1/sandboxes/{sandbox_id}/read")
    def read(sandbox_id: str, body: dict = Depends(json_body)):
        path = _field(body, "path", "a path string", lambda v: isinstance(v, str))
        with pool.use(sandbox_id) as sandbox:
            data = sandbox.read_file(path)
        return {"data_b64": base64.b64encode(data).decode()}

    @app.post("/v1/sandboxes/{sandbox_id}/write")
    def write(sandbox_id: str, body: dict = Depends(json_body)):
        path = _field(body, "path", "a path string", lambda v: isinstance(v, str))
        data_b64 = _field(body, "data_b64", "a base64 string", lambda v: isinstance(v, str))
        try:
            data = base64.b64decode(data_b64, validate=True)
        except ValueError as e:  # binascii.Error, or a character outside ASCII
            raise _bad("data_b64", data_b64, f"standard base64 ({e})") from None
        with pool.use(sandbox_id) as sandbox:
            sandbox.write_file(path, data)
        return {}

    @app.post("/v1/sandboxes/{sandbox_id}/list")
    def list_(sandbox_id: str, body: dict = Depends(json_body)):
        path = _field(body, "path", "a path string", lambda v: isinstance(v, str), ".")
        recursive = _field(body, "recursive", "true or false", lambda v: isinstance(v, bool), False)
        with pool.use(sandbox_id) as sandbox:
            entries = sandbox.list_files(path, recursive)
        return {"entries": [dataclasses.asdict(e) for e in entries]}

    @app.post("/v1/sandboxes/{sandbox_id}/heartbeat")
    async def heartbeat(sandbox_id: str):
        pool.touch(sandbox_id)
        return {}

    @app.delete("/v1/sandboxes/{sandbox_id}")
    def close(sandbox_id: str):
        pool.close(sandbox_id)
        return {}

    token = config.token.encode()
    caps = {"upload": config.max_upload_mb, "request": config.max_request_mb}

    def body_cap(path: str) -> tuple[str, int]:
        what = "upload" if path == UPLOAD_PATH else "request"
        return what, caps[what]

    return BearerGate(app, lambda given: "client" if hmac.compare_digest(given, token) else None, body_cap,
                      open_paths={HEALTH_PATH})


_MISSING = object()


def _field(body: dict, name: str, expected: str, ok, default=_MISSING):
    """body[name] if ok(value), else a ValueError naming the field, the value and `expected`."""
    value = body.get(name, default)
    if value is _MISSING:
        raise ValueError(f"{name}: missing; expected {expected}")
    if not ok(value):
        raise _bad(name, value, expected)
    return value


def _bad(name: str, value, expected: str) -> ValueError:
    shown = repr(value)
    if len(shown) > 100:
        shown = shown[:100] + f"... ({len(shown)} characters)"
    return ValueError(f"{name}: got {shown}, expected {expected}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_object(v) -> bool:
    return isinstance(v, dict)


def _is_command(v) -> bool:
    """A bash command line, or an argv."""
    return isinstance(v, str) or isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v)


def _client_config(config: ServerConfig, overrides) -> SandboxConfig:
    """The server's sandbox defaults with a client's overrides, every field type-checked."""
    from carl.config import from_dict

    if not isinstance(overrides, dict):
        raise _bad("config", overrides, "a JSON object of SandboxConfig fields")
    unknown = sorted(set(overrides) - set(CLIENT_FIELDS))
    if unknown:
        raise ValueError(
            f"config.{unknown[0]}: not settable by a client; expected some of {', '.join(CLIENT_FIELDS)}"
        )
    defaults = {f.name: getattr(config.sandbox, f.name) for f in dataclasses.fields(SandboxConfig)}
    sandbox = from_dict(SandboxConfig, {**defaults, **overrides}, prefix="config")
    if sandbox.timeout_s > config.max_timeout_s:
        raise _bad("config.timeout_s", sandbox.timeout_s, f"at most max_timeout_s={config.max_timeout_s:g}")
    return sandbox


def _create_from_tar(pool: SandboxPool, data: bytes, config: SandboxConfig):
    staging = Scratch(UPLOAD_PREFIX, None, None)
    cap_bytes, total = config.disk_mb << 20, 0

    def capped(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        nonlocal total  # a small upload can unpack to far more: stop at what the sandbox could hold
        total += member.size
        if total > cap_bytes:
            raise ValueError(f"upload unpacks to over disk_mb={config.disk_mb} MiB; expected a smaller tree")
        return tarfile.data_filter(member, dest)

    try:
        (staging.path / "src").mkdir()
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(staging.path / "src", filter=capped)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise ValueError(f"upload is not a valid tar.gz of a directory: {e}") from e
        return pool.create(staging.path / "src", config)
    finally:
        staging.close()


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, log_level="info")
