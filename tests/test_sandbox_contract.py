"""The adversarial contract every sandbox backend is held to, one hostile probe per test.

Each probe runs against every backend (`BACKENDS`): bwrap, gvisor (where runsc is installed),
remote (the environment server, hosting bwrap, in this process) and local. The local backend
isolates nothing by design: it is held to the probes of the host's own file operations (which
protect the host from the agent whatever the backend), and the isolation probes skip it.

What a hostile agent tries, and what must hold:
- file calls racing a command that swaps a workspace directory for a symlink to a host
  directory (through the tools, the agent loop and the server): no host file read or written;
- special files (a FIFO) and huge sparse files: no hang, no read into the host's memory;
- paths that leave the workspace: refused;
- network, host directories, writes outside the workspace, other uids, new namespaces, the
  keyring, ptrace: refused inside;
- limits: a fork bomb, memory across many processes, disk, background children at a timeout.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from carl.harness.agent import EpisodeLimits, run_episode
from carl.harness.execute import run_calls
from carl.harness.policies import ScriptedChatPolicy
from carl.harness.protocol import render_call
from carl.harness.tools import default_tools
from carl.sandbox import SandboxConfig, SandboxPathError, cgroup, open_sandbox
from carl.types import ToolCall
from env_server import start
from tools_sandbox import HashingEmbedder

ISOLATING = ("bwrap", "gvisor", "remote")


def _available(backend: str) -> bool:
    if backend in ("bwrap", "remote"):
        return shutil.which("bwrap") is not None
    if backend == "gvisor":
        return shutil.which("runsc") is not None and os.geteuid() == 0
    return True


@pytest.fixture(scope="module")
def server():
    srv = start(backend="bwrap")
    yield srv
    srv.stop()


@pytest.fixture(params=["bwrap", "gvisor", "remote", "local"])
def backend(request):
    if not _available(request.param):
        pytest.skip(f"{request.param} is not available here")
    return request.param


@pytest.fixture
def make(backend, request, tmp_path):
    """make(**config) -> an open sandbox of this backend over a small repo (closed after the test)."""
    repo = tmp_path / "repo"
    (repo / "d").mkdir(parents=True)
    (repo / "d" / "inside.txt").write_text("inside\n")
    (repo / "pkg.py").write_text("VALUE = 1\n")
    opened = []

    def _make(**kw):
        kw.update(timeout_s=30, python_env=sys.prefix)
        config = request.getfixturevalue("server").config(**kw) if backend == "remote" else SandboxConfig(backend, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # local warns that it isolates nothing
            sb = open_sandbox(repo, config)
        opened.append(sb)
        return sb

    yield _make
    for sb in opened:
        sb.close()


@pytest.fixture
def host_secret(tmp_path):
    """A root-only host directory with a secret file, which no probe may read or change."""
    d = tmp_path / "host-secret"
    d.mkdir(mode=0o700)
    (d / "secret.txt").write_text("HOST SECRET 7f3a\n")
    os.chmod(d / "secret.txt", 0o600)
    return d


def _unchanged(d: Path) -> bool:
    st = os.stat(d / "secret.txt")
    return (sorted(os.listdir(d)) == ["secret.txt"] and (d / "secret.txt").read_text() == "HOST SECRET 7f3a\n"
            and (st.st_uid, st.st_mode & 0o777) == (os.getuid(), 0o600))


def _swapper(target: Path, seconds: float) -> str:
    """A command that swaps the workspace's d/ for a symlink to `target` (a host path) and back."""
    return (f"end=$((SECONDS+{int(seconds)})); while [ $SECONDS -lt $end ]; do "
            f"mv d d.real && ln -s {target} d && rm d && mv d.real d; done; echo swapped")


def _isolating(backend: str) -> None:
    if backend not in ISOLATING:
        pytest.skip(f"{backend} isolates nothing (development only): no isolation probe applies")


# ------------------------------------------------------------------------------ the host's file operations


def test_paths_that_leave_the_workspace_are_refused(make):
    sb = make()
    sb.exec("ln -s /etc/passwd abs_link; ln -s ../../.. up_link; ln -s d inner_link")
    assert sb.read_file("inner_link/inside.txt") == b"inside\n"
    for bad in ("/etc/passwd", "../x", "d/../../x", "abs_link", "up_link/etc/passwd", "a\x00b"):
        for op in (lambda p: sb.read_file(p), lambda p: sb.write_file(p, b"x"), lambda p: sb.list_files(p)):
            with pytest.raises(SandboxPathError):
                op(bad)


def test_a_fifo_and_a_sparse_file_neither_block_nor_fill_the_host(make):
    sb = make()
    res = sb.exec("mkfifo pipe && truncate -s 100G sparse && echo ok")
    assert res.exit_code == 0, res.output
    done: dict[str, object] = {}
    ops = {"read pipe": lambda: sb.read_file("pipe"), "read sparse": lambda: sb.read_file("sparse"),
           "write pipe": lambda: sb.write_file("pipe", b"x")}
    for name, op in ops.items():
        worker = threading.Thread(target=lambda n=name, op=op: done.__setitem__(n, _try(op)), daemon=True)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive(), f"{name} blocked"
    assert isinstance(done["read sparse"], SandboxPathError), done
    # Under bwrap the FIFO is a host FIFO: refused both ways. gVisor keeps FIFOs in its own kernel,
    # so the host sees no file there, and writing one makes a plain file.
    assert isinstance(done["read pipe"], SandboxPathError), done
    assert isinstance(done["write pipe"], SandboxPathError) or sb.read_file("pipe") == b"x", done


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the probe records what happened
        return e


def test_file_calls_racing_a_swapping_command_never_reach_the_host(make, host_secret, tmp_path):
    """The race of issue 27 through every tool that acts on the host's copy (run_calls, as the
    agent loop runs one message): read, write, edit, list, glob, semantic search."""
    sb = make()
    tools = default_tools(embedder=HashingEmbedder(), cache_dir=tmp_path / "index")
    swap = threading.Thread(target=lambda: sb.exec(_swapper(host_secret, 2), timeout_s=20), daemon=True)
    swap.start()
    calls = [ToolCall("read_file", {"path": "d/secret.txt"}), ToolCall("write_file", {"path": "d/new.txt", "content": "x"}),
             ToolCall("edit_file", {"path": "d/secret.txt", "old": "HOST", "new": "AGENT"}),
             ToolCall("list_dir", {"path": "d"}), ToolCall("glob", {"pattern": "d/*"}),
             ToolCall("semantic_search", {"query": "host secret"})]
    outputs = []
    deadline = time.monotonic() + 4
    while swap.is_alive() and time.monotonic() < deadline:
        outputs += [r.output for r in run_calls(calls, tools, sb)]
    swap.join(timeout=20)
    assert len(outputs) > 20
    assert not any("HOST SECRET" in o for o in outputs)
    assert _unchanged(host_secret)


def test_one_message_with_a_swapper_and_file_calls_through_the_agent_loop(make, host_secret):
    """The same race as the model would write it: one assistant message carrying the swapping
    command and the file calls (they run in parallel), several times over."""
    sb = make()
    message = "".join([render_call(ToolCall("run_terminal", {"command": _swapper(host_secret, 1)})),
                       *[render_call(ToolCall("read_file", {"path": "d/secret.txt"})) for _ in range(10)],
                       render_call(ToolCall("write_file", {"path": "d/planted.txt", "content": "x"}))])
    policy = ScriptedChatPolicy([message] * 3 + [render_call(ToolCall("finish", {}))])
    task = type("T", (), {"instance_id": "race", "problem_statement": "race"})()
    traj = run_episode(policy, sb, task, EpisodeLimits(max_turns=6, wall_time_s=120))
    outputs = [r.output for t in traj.turns for r in t.results]
    assert any("swapped" in o for o in outputs)
    assert not any("HOST SECRET" in o for o in outputs)
    assert _unchanged(host_secret)


# ------------------------------------------------------------------------------ isolation


def test_no_network_but_loopback_works(backend, make):
    _isolating(backend)
    sb = make()
    code = ("import socket\ns=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n"
            "c=socket.create_connection(s.getsockname()); print('loopback ok')\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=3); print('OUT')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n")
    res = sb.exec(["python", "-c", code])
    assert "loopback ok" in res.stdout and "blocked" in res.stdout and "OUT" not in res.stdout, res.output


def test_host_directories_are_invisible_and_system_ones_read_only(backend, make, host_secret):
    _isolating(backend)
    sb = make()
    res = sb.exec(f"ls {host_secret} /root/.ssh /work /home 2>&1; echo x > /usr/evil; echo x > /etc/evil; "
                  f"cat /etc/shadow; echo done")
    assert "secret.txt" not in res.stdout and "done" in res.stdout
    assert not Path("/usr/evil").exists() and not Path("/etc/evil").exists()


def test_the_environment_inside_resolves_users_and_localhost(backend, make):
    _isolating(backend)
    sb = make()
    code = ("import getpass, os, pwd, socket\n"
            "print(pwd.getpwuid(os.getuid()).pw_name, getpass.getuser(), socket.gethostbyname('localhost'),"
            " os.getuid(), oct(os.stat('/etc').st_mode & 0o777))\n")
    res = sb.exec(["python", "-c", code])
    assert res.exit_code == 0, res.output
    name, user, localhost, uid, etc_mode = res.stdout.split()
    assert name == user == "agent" and localhost == "127.0.0.1" and etc_mode == "0o755"
    if os.geteuid() == 0:
        assert int(uid) != 0


def test_kernel_interfaces_no_test_needs_are_denied(backend, make):
    """No new user namespace (the usual first step of a kernel exploit), keyring, bpf or ptrace."""
    _isolating(backend)
    sb = make()
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for name, call in [('unshare', lambda: libc.unshare(0x10000000)),"
            " ('keyctl', lambda: libc.syscall(250, 0, 0)),"  # KEYCTL_GET_KEYRING_ID on x86_64
            " ('ptrace', lambda: libc.ptrace(0, 0, 0, 0)), ('bpf', lambda: libc.syscall(321, 0, 0, 0))]:\n"
            "    print(name, 'allowed' if call() == 0 else 'denied')\n")
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 system call numbers")
    res = sb.exec(["python", "-c", code])
    assert res.exit_code == 0, res.output
    assert "allowed" not in res.stdout, res.stdout


def test_a_fork_bomb_stops_at_the_process_limit(backend, make):
    _isolating(backend)
    sb = make(max_procs=64)
    res = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout_s=20)
    assert sb.exec("echo alive").stdout == "alive\n"  # the sandbox (and the host) still work
    assert res.timed_out or "survived" in res.stdout or res.exit_code != 0


def test_memory_is_limited_for_the_sandbox_as_a_whole(backend, make):
    """Three processes of 300 MiB each, each under the per-process limit, together over the group's."""
    _isolating(backend)
    if backend in ("bwrap", "remote") and not cgroup.available():
        pytest.skip("no writable cgroup hierarchy: memory is limited per process only")
    sb = make(memory_mb=512)
    hog = "python -c 'b = bytearray(300 << 20); b[::4096] = bytes(len(b[::4096])); import time; time.sleep(3)'"
    res = sb.exec(f"for i in 1 2 3; do {hog} & done; wait; echo waited", timeout_s=30)
    assert "Killed" in res.output or "MemoryError" in res.output, res.output


def test_disk_use_is_capped(backend, make):
    _isolating(backend)
    if os.geteuid() != 0:
        pytest.skip("the disk quota needs a root host")
    sb = make(disk_mb=64)
    res = sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; dd if=/dev/zero of=fill bs=1M count=200 2>&1",
                  timeout_s=30)
    assert res.output.count("No space left on device") == 2, res.output


def test_a_timeout_kills_background_children(backend, make):
    _isolating(backend)
    sb = make()
    res = sb.exec("(sleep 2; echo late > late.txt) & sleep 30", timeout_s=1)
    assert res.timed_out
    time.sleep(2.5)
    assert "late.txt" not in [e.path for e in sb.list_files(".")]
