"""The environment server in-process (uvicorn in a thread) and RemoteSandbox against it."""

import shutil
import socket
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import pytest

from carl.sandbox import SandboxError, SandboxPathError, open_sandbox
from carl.sandbox.server import ServerConfig
from env_server import TOKEN, start

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


# ---- hostile input: auth before the body, size caps, typed fields ---------------------------------

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HTTP = httpx.Client()  # one client: making an SSL context per request costs ~50 ms


@pytest.fixture(scope="module", autouse=True)
def close_http():
    yield
    HTTP.close()


def _raw_request(port: int, head: str) -> tuple[socket.socket, bytes]:
    """Send only a request head; return the socket and the whole reply (the server closes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(head.encode())
    reply = b""
    while chunk := s.recv(65536):  # a server that waits for the body times out here instead
        reply += chunk
    return s, reply


def test_an_unauthenticated_body_is_never_read(server):
    size = 100 << 20
    head = f"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    s, reply = _raw_request(server.port, head)
    assert reply.startswith(b"HTTP/1.1 401") and b'"kind": "auth"' in reply
    assert b"Expecting" not in reply  # no parser details for a stranger
    sent = 0
    with s, pytest.raises(OSError):  # the server closed: the 100 MB body is cut short
        while sent < size:
            sent += s.send(b"x" * (1 << 20))
    assert sent < size


@pytest.fixture
def small_server():
    srv = start(max_request_mb=1, max_upload_mb=1)
    yield srv
    srv.stop()


def test_a_declared_oversize_body_is_refused_before_it_is_read(small_server):
    head = f"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {10 << 30}\r\n\r\n"
    s, reply = _raw_request(small_server.port, head)
    s.close()
    assert reply.startswith(b"HTTP/1.1 413") and b'"kind": "too_large"' in reply


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", ["/v1/sandboxes", "/v1/sandboxes/upload"])
def test_an_oversize_body_is_refused_while_it_is_read(small_server, path, chunked):
    data = b"x" * (2 << 20)
    content = iter([data[: 1 << 19]] * 4) if chunked else data  # a generator goes out chunked
    resp = httpx.post(f"{small_server.url}{path}", content=content, headers=AUTH)
    assert (resp.status_code, resp.json()["kind"]) == (413, "too_large")
    assert httpx.get(f"{small_server.url}/v1/health").json() == {"ok": True}


@pytest.fixture(scope="module")
def shared():
    """One server and one open sandbox for the many requests below that must all be refused."""
    srv = start(max_sandboxes=2, ttl_s=60)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (Path(tmp) / "pkg").mkdir()
        (Path(tmp) / "pkg" / "__init__.py").write_text("VALUE = 41\n")
        sb = open_sandbox(tmp, srv.config())
        yield srv, sb.id
        sb.close()
    srv.stop()


BAD_FIELDS = [
    # endpoint, body, the field the message must name
    ("", {"source_path": 5}, "source_path"),
    ("", {}, "source_path"),
    ("", {"source_path": "/", "config": [1]}, "config"),
    ("", {"source_path": "/", "config": {"timeout_s": "x"}}, "config.timeout_s"),
    ("", {"source_path": "/", "config": {"timeout_s": -1}}, "timeout_s"),
    ("", {"source_path": "/", "config": {"timeout_s": 1e9}}, "config.timeout_s"),
    ("", {"source_path": "/", "config": {"memory_mb": 1.5}}, "config.memory_mb"),
    ("", {"source_path": "/", "config": {"network": "yes"}}, "config.network"),
    ("", {"source_path": "/", "config": {"python_env": 5}}, "config.python_env"),
    ("", {"source_path": "/", "config": {"ro_binds": "/etc"}}, "config.ro_binds"),
    ("", {"source_path": "/", "config": {"env": [1]}}, "config.env"),
    ("", {"source_path": "/", "config": {"env": {"A": 1}}}, "config.env.A"),
    ("", {"source_path": "/", "config": {"backend": "local"}}, "config.backend"),
    ("/exec", {"command": 5}, "command"),
    ("/exec", {"command": {"a": 1}}, "command"),
    ("/exec", {"command": []}, "command"),
    ("/exec", {"command": ["ls", 1]}, "command"),
    ("/exec", {}, "command"),
    ("/exec", {"command": "true", "timeout_s": "x"}, "timeout_s"),
    ("/exec", {"command": "true", "timeout_s": -1}, "timeout_s"),
    ("/exec", {"command": "true", "timeout_s": 0}, "timeout_s"),
    ("/exec", {"command": "true", "timeout_s": 1e9}, "timeout_s"),
    ("/exec", {"command": "true", "timeout_s": True}, "timeout_s"),
    ("/exec", {"command": "true", "cwd": 5}, "cwd"),
    ("/exec", {"command": "true", "env": [1]}, "env"),
    ("/exec", {"command": "true", "env": {"A": 1}}, "env"),
    ("/exec", {"command": "true", "stdin": 5}, "stdin"),
    ("/read", {"path": 5}, "path"),
    ("/read", {}, "path"),
    ("/write", {"path": 5, "data_b64": ""}, "path"),
    ("/write", {"path": "a", "data_b64": 5}, "data_b64"),
    ("/write", {"path": "a"}, "data_b64"),
    ("/list", {"path": 5}, "path"),
    ("/list", {"recursive": "yes"}, "recursive"),
]


def _post(server, sandbox_id: str, endpoint: str, **kw) -> httpx.Response:
    url = f"{server.url}/v1/sandboxes" + (f"/{sandbox_id}{endpoint}" if endpoint else "")
    return HTTP.post(url, headers=kw.pop("headers", AUTH), **kw)


def _assert_request_error(resp: httpx.Response, field: str) -> str:
    assert resp.status_code == 400, resp.text
    detail = resp.json()
    assert detail["kind"] == "request" and field in detail["message"], detail
    assert "expected" in detail["message"], detail
    return detail["message"]


@pytest.mark.parametrize("endpoint, body, field", BAD_FIELDS)
def test_a_wrong_field_is_a_400_naming_it(shared, endpoint, body, field):
    message = _assert_request_error(_post(*shared, endpoint, json=body), field)
    if field in body and not isinstance(body[field], dict):
        assert repr(body[field]) in message  # the value, and what was expected


@pytest.mark.parametrize("endpoint", ["", "/exec", "/read", "/write", "/list"])
@pytest.mark.parametrize("content", [b"[1, 2]", b'"text"', b"{not json", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_a_400(shared, endpoint, content):
    _assert_request_error(_post(*shared, endpoint, content=content), "request body")


def test_nan_is_not_a_number(shared):
    resp = _post(*shared, "/exec", content=b'{"command": "true", "timeout_s": NaN}')
    _assert_request_error(resp, "timeout_s")


@pytest.mark.parametrize(
    "config, field",
    [("not json", "config"), ("[1]", "config"), ('{"nope": 1}', "config.nope"),
     ('{"timeout_s": "x"}', "config.timeout_s"), ('{"max_procs": null}', "config.max_procs")],
)  # fmt: skip
def test_a_bad_upload_config_is_a_400_naming_it(shared, config, field):
    resp = HTTP.post(
        f"{shared[0].url}/v1/sandboxes/upload", params={"config": config}, content=b"", headers=AUTH
    )
    _assert_request_error(resp, field)


@pytest.mark.parametrize("data_b64", ["not base64!", "YW\nJj", "YWJjZA", "YWJj\u00e9"])
def test_invalid_base64_is_a_400_and_writes_nothing(shared, data_b64):
    path = "b64-" + data_b64.encode().hex()
    _assert_request_error(_post(*shared, "/write", json={"path": path, "data_b64": data_b64}), "data_b64")
    assert _post(*shared, "/read", json={"path": path}).json()["kind"] == "path"  # not written
    assert _post(*shared, "/write", json={"path": "empty", "data_b64": ""}).status_code == 200  # b"" is valid


def test_the_client_turns_a_400_into_a_sandbox_error(server, repo):
    with open_sandbox(repo, server.config()) as sb:
        with pytest.raises(SandboxError, match=r"HTTP 400 \(request\): timeout_s"):
            sb.exec("true", timeout_s=1e9)
    with pytest.raises(SandboxError, match="config.timeout_s"):
        open_sandbox(repo, server.config(timeout_s=1e9))


def test_the_server_stays_healthy_after_hostile_requests(shared, repo):
    server, sandbox_id = shared  # after every test above used it
    for endpoint, body, _ in BAD_FIELDS:
        _post(server, sandbox_id, endpoint, json=body)
        _post(server, sandbox_id, endpoint, content=b"{not json")
        _post(server, sandbox_id, endpoint, json=body, headers={})  # no token
    assert server.app.state.pool.count() == 1  # nothing leaked, nothing lost
    with open_sandbox(repo, server.config()) as sb:
        assert sb.exec("cat pkg/__init__.py").stdout == "VALUE = 41\n"
    assert _post(server, sandbox_id, "/exec", json={"command": ["echo", "ok"]}).json()["stdout"] == "ok\n"


def test_a_starting_server_removes_upload_staging_left_by_a_killed_one():
    # What a server killed mid-upload leaves: a staging directory whose lock nobody holds.
    left = Path(tempfile.mkdtemp(prefix="carl-upload-999999999-"))
    (left / ".owner.lock").touch()
    (left / "src").mkdir()
    srv = start()
    try:
        assert not left.exists()
    finally:
        srv.stop()
        shutil.rmtree(left, ignore_errors=True)


def test_an_upload_that_unpacks_past_disk_mb_is_refused(server, repo):
    (repo / "zeros.bin").write_bytes(bytes(2 << 20))  # compresses to a few KiB
    with pytest.raises(SandboxError, match=r"400 \(request\): upload unpacks to over disk_mb=1"):
        open_sandbox(repo, server.config(disk_mb=1))
    assert server.app.state.pool.count() == 0
