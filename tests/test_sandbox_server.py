"""The environment server in-process (uvicorn in a thread) and RemoteSandbox against it."""

import socket
import threading
import time
import warnings

import httpx
import pytest

from carl.sandbox import SandboxConfig, SandboxError, SandboxPathError, open_sandbox
from carl.sandbox.server import ServerConfig, create_app

TOKEN = "test-token"


class RunningServer:
    def __init__(self, config: ServerConfig):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def config(self, **kw) -> SandboxConfig:
        return SandboxConfig(backend="remote", server_url=self.url, server_token=TOKEN, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def start(backend="local", **kw) -> RunningServer:
    return RunningServer(ServerConfig(token=TOKEN, sandbox=SandboxConfig(backend=backend), **kw))


@pytest.fixture(autouse=True)
def quiet_local_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 41\n")
    return src


@pytest.fixture
def server():
    srv = start(max_sandboxes=2, ttl_s=60)
    yield srv
    srv.stop()


def test_token_is_required(server):
    assert httpx.get(f"{server.url}/v1/health").json() == {"ok": True}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        resp = httpx.post(f"{server.url}/v1/sandboxes", json={"source_path": "/tmp"}, headers=headers)
        assert resp.status_code == 401, headers
        assert resp.json()["kind"] == "auth"


def test_server_refuses_an_empty_token():
    with pytest.raises(ValueError, match="token"):
        ServerConfig(token="")


def test_client_round_trips_the_protocol(server, repo):
    with open_sandbox(repo, server.config()) as sb:
        res = sb.exec("python3 -c 'import pkg; print(pkg.VALUE)'; echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr) == (3, "41\n", "err\n")
        assert sb.exec(["cat"], stdin="in").stdout == "in"
        sb.write_file("a/b.bin", bytes(range(256)))
        assert sb.read_file("a/b.bin") == bytes(range(256))
        assert {e.path for e in sb.list_files(recursive=True)} >= {"a", "a/b.bin", "pkg", "pkg/__init__.py"}
        assert [e.path for e in sb.list_files("a")] == ["a/b.bin"]
        slow = sb.exec("sleep 5", timeout_s=0.3)
        assert slow.timed_out and slow.exit_code == 124
        with pytest.raises(SandboxPathError):
            sb.read_file("../../etc/passwd")
        with pytest.raises(SandboxPathError):
            sb.read_file("missing.txt")
    with pytest.raises(SandboxError, match="closed"):
        sb.exec("true")
    assert (repo / "pkg" / "__init__.py").read_text() == "VALUE = 41\n"


def test_create_from_a_server_path(server, repo):
    with open_sandbox(f"server:{repo}", server.config()) as sb:
        assert sb.read_file("pkg/__init__.py") == b"VALUE = 41\n"
    with pytest.raises(SandboxPathError):
        open_sandbox(f"server:{repo}/nope", server.config())


def test_cap_is_enforced(server, repo):
    a = open_sandbox(repo, server.config())
    b = open_sandbox(repo, server.config())
    with pytest.raises(SandboxError, match="429"):
        open_sandbox(repo, server.config())
    a.close()
    open_sandbox(repo, server.config()).close()
    b.close()


def test_ttl_reaps_sandboxes_without_heartbeats(repo):
    srv = start(ttl_s=0.3)
    try:
        pool = srv.app.state.pool
        alive = open_sandbox(repo, srv.config())  # its heartbeat thread beats every 0.1 s
        silent = open_sandbox(repo, srv.config())
        silent._stop.set()  # the client "vanished": no more heartbeats
        time.sleep(1.0)
        assert pool.count() == 1
        assert alive.exec("echo ok").stdout == "ok\n"
        with pytest.raises(SandboxError, match="404"):
            silent.exec("true")
        alive.close()
        silent.close()  # closing a reaped sandbox is quiet
        assert pool.count() == 0
    finally:
        srv.stop()


def test_server_gone_is_a_sandbox_error(repo):
    srv = start()
    sb = open_sandbox(repo, srv.config())
    srv.stop()
    with pytest.raises(SandboxError, match="environment server"):
        sb.exec("true")
    sb.close()


def test_bwrap_backend_behind_the_server(repo):
    from carl.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        pytest.skip("bubblewrap not installed")
    srv = start(backend="bwrap")
    try:
        with open_sandbox(repo, srv.config()) as sb:
            assert sb.workdir == "/workspace"
            assert sb.exec("pwd; cat pkg/__init__.py").stdout == "/workspace\nVALUE = 41\n"
    finally:
        srv.stop()
