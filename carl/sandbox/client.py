"""RemoteSandbox: the Sandbox protocol over HTTP to `carl env serve` (backend "remote").

The source directory is uploaded as a tar.gz, or, given as "server:/path", copied on the server
from its own filesystem. A daemon thread sends a heartbeat every ttl_s / 3 so that the server
keeps the sandbox while this process lives; when the process dies, the server reaps it after
ttl_s. Server and transport errors surface as SandboxPathError (a bad path: kind "path") and
SandboxError (everything else, with the HTTP status, the kind and the server's message: a
malformed request, a body over the server's cap, a sandbox failure, ...; see carl.sandbox.server),
never as HTTP exceptions.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import ssl
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import httpx

from carl.sandbox.base import ExecResult, FileEntry, SandboxConfig, SandboxError, SandboxPathError
from carl.sandbox.server import CLIENT_FIELDS

SERVER_PREFIX = "server:"
"""A source_dir starting with this names a directory on the server instead of one to upload."""
_HTTP_SLACK_S = 30.0
"""HTTP timeout of an exec beyond its own time limit (server-side copy, queueing, transfer)."""


class RemoteSandbox:
    """A sandbox hosted by a `carl env serve` server."""

    def __init__(self, source_dir: str | Path, config: SandboxConfig):
        if not config.server_url:
            raise SandboxError("sandbox.server_url: the remote backend needs the server's URL")
        token = config.server_token or os.environ.get("CARL_ENV_TOKEN")
        if not token:
            raise SandboxError("sandbox.server_token: not set and $CARL_ENV_TOKEN is empty")
        self.config = config
        self._closed = True  # until the server made it
        self._http = httpx.Client(
            base_url=config.server_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=config.timeout_s + _HTTP_SLACK_S,
            verify=_ssl_context(),
        )
        overrides = {name: getattr(config, name) for name in CLIENT_FIELDS}
        overrides["ro_binds"] = list(config.ro_binds)
        source = str(source_dir)
        if source.startswith(SERVER_PREFIX):
            made = self._call("POST", "/v1/sandboxes", json={"source_path": source[len(SERVER_PREFIX):],
                                                             "config": overrides})  # fmt: skip
        else:
            made = self._call(
                "POST",
                "/v1/sandboxes/upload",
                params={"config": json.dumps(overrides)},
                content=_tar_gz(Path(source)),
                headers={"Content-Type": "application/gzip"},
            )
        self.id: str = made["id"]
        self.workdir: str = made["workdir"]
        self._closed = False
        self._stop = threading.Event()
        self._beat = threading.Thread(
            target=self._heartbeat_loop, args=(float(made["ttl_s"]) / 3,), name="carl-heartbeat", daemon=True
        )
        self._beat.start()

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        limit_s = timeout_s or self.config.timeout_s
        body = {"command": command if isinstance(command, str) else list(command), "timeout_s": limit_s,
                "cwd": cwd, "env": env, "stdin": stdin}  # fmt: skip
        out = self._call("POST", f"/v1/sandboxes/{self.id}/exec", json=body, timeout=limit_s + _HTTP_SLACK_S)
        return ExecResult(**out)

    def read_file(self, path: str) -> bytes:
        out = self._call("POST", f"/v1/sandboxes/{self.id}/read", json={"path": path})
        return base64.b64decode(out["data_b64"])

    def write_file(self, path: str, data: bytes) -> None:
        body = {"path": path, "data_b64": base64.b64encode(data).decode()}
        self._call("POST", f"/v1/sandboxes/{self.id}/write", json=body)

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        out = self._call("POST", f"/v1/sandboxes/{self.id}/list", json={"path": path, "recursive": recursive})
        return [FileEntry(**e) for e in out["entries"]]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._call("DELETE", f"/v1/sandboxes/{self.id}", check_open=False)
        except SandboxError:
            pass  # already reaped or server gone: nothing is left to close
        finally:
            self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _heartbeat_loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            try:
                self._http.post(f"/v1/sandboxes/{self.id}/heartbeat", timeout=max(period_s, 1.0))
            except (httpx.HTTPError, RuntimeError):
                pass  # a missed beat is retried next period; the TTL allows several

    def _call(self, method: str, url: str, *, check_open: bool = True, **kw) -> dict:
        if check_open and self._closed and hasattr(self, "id"):
            raise SandboxError("sandbox is closed")
        try:
            resp = self._http.request(method, url, **kw)
        except httpx.HTTPError as e:
            raise SandboxError(f"environment server {self.config.server_url}: {type(e).__name__}: {e}") from e
        if resp.status_code == 200:
            return resp.json()
        try:
            detail = resp.json()
        except ValueError:
            detail = None
        if isinstance(detail, dict):  # the server's {"kind", "message"}, or FastAPI's {"detail"}
            kind, message = detail.get("kind", "http"), detail.get("message") or detail.get("detail")
        else:  # not from carl's server (a proxy, a load balancer)
            kind, message = "http", resp.text[:500]
        if kind == "path":
            raise SandboxPathError(message)
        raise SandboxError(f"environment server: HTTP {resp.status_code} ({kind}): {message}")


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying SSL context per process: making one costs ~50 ms, too much per sandbox."""
    return ssl.create_default_context()


def _tar_gz(source: Path) -> bytes:
    if not source.is_dir():
        raise SandboxError(f"sandbox source {str(source)!r} is not a directory")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.add(source, arcname=".")
    return buf.getvalue()
