"""The environment server: many sandboxes behind HTTP, for remote rollout workers.

    rollout worker                          carl env serve (this module)
    RemoteSandbox ---- POST /v1/sandboxes ---> open_sandbox(copy of a server path or upload)
         |        ---- POST .../{id}/exec ---> sandbox.exec(...)         (thread pool)
         |        ---- read/write/list ------> sandbox.read_file(...)
    heartbeat thread -- POST .../heartbeat --> last_seen = now           (event loop, cheap)
         |        ---- DELETE .../{id} ------> sandbox.close()
                                             reaper thread: close sandboxes whose last_seen is
                                             older than ttl_s and that run no request

Every request but GET /v1/health needs `Authorization: Bearer <token>` (401 otherwise).
Whoever holds the token runs arbitrary code in sandboxes and can copy any path the server can
read into one: the token is full trust, keep the server on a private network.
Errors are JSON {"kind": "path" | "sandbox" | "capacity" | "not_found" | "auth", "message"}:
400 path (SandboxPathError), 404 unknown sandbox, 429 at max_sandboxes, 500 sandbox failure.
"""

import base64
import dataclasses
import hmac
import io
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from carl.sandbox.base import SandboxConfig, SandboxError, SandboxPathError

CLIENT_FIELDS = ("timeout_s", "memory_mb", "cpu_s", "max_procs", "max_output_bytes", "network",
                 "python_env", "ro_binds", "env")  # fmt: skip
"""SandboxConfig fields a client may set per sandbox; the backend is the server's."""


@dataclass(frozen=True)
class ServerConfig:
    token: str
    """Bearer token every request must carry (required; there is no tokenless mode)."""
    max_sandboxes: int = 64
    """Most sandboxes open at once; creating one more gets HTTP 429."""
    ttl_s: float = 300.0
    """A sandbox whose client sent nothing (heartbeats included) for this long is closed."""
    max_upload_mb: int = 512
    """Largest accepted tar.gz upload of a source directory, in MiB."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Defaults for the sandboxes; its backend ("bwrap" or "local") is what the server runs."""

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("env.token: empty; the server runs arbitrary code and needs a token")
        for name in ("max_sandboxes", "ttl_s", "max_upload_mb"):
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

    def create(self, source: Path, overrides: dict) -> tuple[str, object]:
        from carl.sandbox import open_sandbox

        unknown = set(overrides) - set(CLIENT_FIELDS)
        if unknown:
            raise ValueError(f"config fields not settable by a client: {sorted(unknown)}")
        if "ro_binds" in overrides:
            overrides["ro_binds"] = tuple(overrides["ro_binds"])
        config = dataclasses.replace(self.config.sandbox, **overrides)
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
    """The FastAPI app (imports FastAPI lazily so that `carl --help` stays fast)."""
    from contextlib import asynccontextmanager

    import anyio.to_thread
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse

    pool = SandboxPool(config)

    @asynccontextmanager
    async def lifespan(app):
        # Blocking endpoints share one thread pool: let every sandbox run one exec at once.
        anyio.to_thread.current_default_thread_limiter().total_tokens = max(40, 2 * config.max_sandboxes)
        pool.start()
        yield
        pool.close_all()

    app = FastAPI(title="carl environment server", lifespan=lifespan)
    app.state.pool = pool

    def error(status: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"kind": kind, "message": message})

    @app.exception_handler(_Auth)
    async def on_auth(request, exc):
        return error(401, "auth", str(exc))

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

    @app.exception_handler(KeyError)
    async def on_missing(request, exc):
        return error(400, "request", f"request body lacks field {exc}")

    async def check_token(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), config.token.encode()):
            raise _Auth("missing or wrong bearer token")

    auth = [Depends(check_token)]

    @app.get("/v1/health")
    async def health():
        return {"ok": True}

    @app.post("/v1/sandboxes", dependencies=auth)
    def create_from_path(body: dict):
        source = body.get("source_path")
        if not isinstance(source, str) or not Path(source).is_dir():
            raise SandboxPathError(f"source_path {source!r} is not a directory on the server")
        sandbox_id, sandbox = pool.create(Path(source), dict(body.get("config") or {}))
        return {"id": sandbox_id, "workdir": sandbox.workdir, "ttl_s": config.ttl_s}

    @app.post("/v1/sandboxes/upload", dependencies=auth)
    async def create_from_upload(request: Request):
        import json

        overrides = json.loads(request.query_params.get("config") or "{}")
        data = await request.body()
        if len(data) > config.max_upload_mb * 1024 * 1024:
            raise ValueError(f"upload is {len(data)} bytes; max_upload_mb={config.max_upload_mb}")
        sandbox_id, sandbox = await anyio.to_thread.run_sync(_create_from_tar, pool, data, overrides)
        return {"id": sandbox_id, "workdir": sandbox.workdir, "ttl_s": config.ttl_s}

    @app.post("/v1/sandboxes/{sandbox_id}/exec", dependencies=auth)
    def exec_(sandbox_id: str, body: dict):
        with pool.use(sandbox_id) as sandbox:
            res = sandbox.exec(
                body["command"],
                timeout_s=body.get("timeout_s"),
                cwd=body.get("cwd", "."),
                env=body.get("env"),
                stdin=body.get("stdin"),
            )
        return dataclasses.asdict(res)

    @app.post("/v1/sandboxes/{sandbox_id}/read", dependencies=auth)
    def read(sandbox_id: str, body: dict):
        with pool.use(sandbox_id) as sandbox:
            data = sandbox.read_file(body["path"])
        return {"data_b64": base64.b64encode(data).decode()}

    @app.post("/v1/sandboxes/{sandbox_id}/write", dependencies=auth)
    def write(sandbox_id: str, body: dict):
        with pool.use(sandbox_id) as sandbox:
            sandbox.write_file(body["path"], base64.b64decode(body["data_b64"]))
        return {}

    @app.post("/v1/sandboxes/{sandbox_id}/list", dependencies=auth)
    def list_(sandbox_id: str, body: dict):
        with pool.use(sandbox_id) as sandbox:
            entries = sandbox.list_files(body.get("path", "."), bool(body.get("recursive", False)))
        return {"entries": [dataclasses.asdict(e) for e in entries]}

    @app.post("/v1/sandboxes/{sandbox_id}/heartbeat", dependencies=auth)
    async def heartbeat(sandbox_id: str):
        pool.touch(sandbox_id)
        return {}

    @app.delete("/v1/sandboxes/{sandbox_id}", dependencies=auth)
    def close(sandbox_id: str):
        pool.close(sandbox_id)
        return {}

    return app


class _Auth(Exception):
    pass


def _create_from_tar(pool: SandboxPool, data: bytes, overrides: dict):
    staging = Path(tempfile.mkdtemp(prefix="carl-upload-"))
    (staging / "src").mkdir()
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(staging / "src", filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ValueError(f"upload is not a valid tar.gz of a directory: {e}") from e
        return pool.create(staging / "src", overrides)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    uvicorn.run(create_app(config), host=host, port=port, log_level="info")
