"""Adversarial tests of the gVisor sandbox, one property each.

Each exec starts a gVisor container (~0.3-1 s on a loaded 2-core VM), so tests batch their probes
into few execs. No `ls`/`stat` inside: this runsc (2022-12) rejects coreutils' statx flags.
"""

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from carl.sandbox import SandboxConfig, SandboxError, SandboxPathError, cgroup, open_sandbox
from carl.sandbox.cgroup import CGROUP_ROOT, own_groups
from carl.sandbox.gvisor import gvisor_available
from carl.sandbox.scratch import sweep_stale

pytestmark = pytest.mark.skipif(not gvisor_available(), reason="gVisor (runsc) not installed")
VENV = Path(sys.prefix)


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 41\n")
    (src / "README.md").write_text("hello\n")
    return src


def sandbox(repo, **kw):
    return open_sandbox(repo, SandboxConfig(backend="gvisor", **kw))


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def host_processes_mentioning(text: str) -> list[str]:
    """Command lines of host processes (runsc, its gofer and sandbox) that mention text."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if text in args:
            found.append(args)
    return found


def scratch_of(sb) -> str:
    return str(sb._host.scratch.path)


def test_echo_exit_code_stdin_and_uid(repo):
    with sandbox(repo) as sb:
        res = sb.exec("pwd; cat README.md; id -u; cat; echo oops >&2; exit 7", stdin="piped in\n")
    pwd, readme, uid, piped = res.stdout.split("\n")[:4]
    assert (res.exit_code, res.stderr) == (7, "oops\n"), res
    assert (pwd, readme, piped) == ("/workspace", "hello", "piped in")
    if os.geteuid() == 0:
        assert int(uid) != 0


def test_files_round_trip_between_host_and_sandbox(repo):
    with sandbox(repo) as sb:
        sb.write_file("a/b/c.txt", b"one\n")
        res = sb.exec("echo two >> c.txt && echo new > d.txt && cat c.txt", cwd="a/b")
        assert res.stdout == "one\ntwo\n", res
        # written inside, read at once on the host: no overlay or cache between them
        assert sb.read_file("a/b/c.txt") == b"one\ntwo\n"
        assert sb.read_file("a/b/d.txt") == b"new\n"
        assert [e.path for e in sb.list_files("a/b")] == ["a/b/c.txt", "a/b/d.txt"]


def test_host_reads_stay_inside_while_a_command_swaps_in_symlinks(repo):
    swapper = (
        "import os, time\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    os.rename('d', 'd.real'); os.symlink('/etc', 'd'); os.unlink('d'); os.rename('d.real', 'd')\n"
    )
    with sandbox(repo) as sb:
        sb.write_file("d/passwd", b"inside\n")
        worker = threading.Thread(target=lambda: sb.exec(["python3", "-c", swapper], timeout_s=30))
        worker.start()
        seen = set()
        while worker.is_alive():
            try:
                seen.add(sb.read_file("d/passwd"))
            except SandboxPathError:
                seen.add("refused")
        worker.join()
    assert seen <= {b"inside\n", "refused"}, seen  # never the host's (or the sandbox's) /etc/passwd


def test_source_untouched_after_edits(repo):
    before = tree_digest(repo)
    with sandbox(repo) as sb:
        sb.write_file("pkg/__init__.py", b"VALUE = 0\n")
        res = sb.exec("rm README.md && echo extra >> pkg/__init__.py && mkdir more && chmod 000 more")
        assert res.exit_code == 0, res
    assert tree_digest(repo) == before


def test_no_network_but_loopback_works(repo):
    probe = (
        "import socket\n"
        "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()\n"
        "socket.create_connection(srv.getsockname(), timeout=2).sendall(b'ok')\n"
        "print('loopback', srv.accept()[0].recv(2).decode())\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "    print('outside reachable')\n"
        "except OSError as e:\n"
        "    print('outside blocked', e.errno)\n"
    )
    with sandbox(repo) as sb:
        res = sb.exec(["python3", "-c", probe])
    assert "loopback ok" in res.stdout, res
    assert "outside blocked" in res.stdout, res


def test_kernel_interfaces_no_test_needs_are_denied_but_processes_and_threads_work(repo):
    probe = (
        "import ctypes, subprocess, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, nr, args in [('unshare', 272, (0x10000000,)),"
        " ('clone-newuser', 56, (0x10000000 | 17, 0, 0, 0, 0)), ('keyctl', 250, (0, 0)),"
        " ('ptrace', 101, (0, 0, 0, 0)), ('bpf', 321, (0, 0, 0))]:\n"
        "    print(name, 'allowed' if libc.syscall(nr, *args) >= 0 else 'denied')\n"
        "t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()\n"
        "print(subprocess.run(['echo', 'child ok'], capture_output=True, text=True).stdout.strip())\n"
    )
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 system call numbers")
    with sandbox(repo) as sb:
        res = sb.exec(["python3", "-c", probe])
    assert res.exit_code == 0, res
    assert "allowed" not in res.stdout and res.stdout.count("denied") == 5, res
    assert "thread ok" in res.stdout and "child ok" in res.stdout


def test_cannot_write_outside_workspace_and_tmp(repo):
    marker = f"carl-escape-{os.getpid()}"
    with sandbox(repo) as sb:
        res = sb.exec(
            f"for d in / /usr /etc /bin /dev /proc /sys /home /root /var /work; do "
            f"touch $d/{marker} 2>/dev/null && echo wrote $d; done; touch /tmp/{marker} && echo tmp ok"
        )
    assert "wrote" not in res.stdout, res
    assert "tmp ok" in res.stdout  # the private /tmp is writable ...
    assert not (Path("/tmp") / marker).exists()  # ... and is not the host's /tmp
    for d in ("/", "/usr", "/etc"):
        assert not (Path(d) / marker).exists()


def test_host_paths_are_not_visible(repo, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("s3cret")
    with sandbox(repo) as sb:
        res = sb.exec(
            f"cat {secret} 2>&1; for d in /root /work /home /opt /var {Path(__file__).parent}; do "
            f"[ -e $d ] && echo visible $d; done; "
            f"grep -rl s3cret / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null; echo done"
        )
    assert "s3cret" not in res.stdout.replace(str(secret), ""), res
    assert "No such file" in res.stdout
    assert "visible" not in res.stdout, res
    assert res.stdout.rstrip().endswith("done")


def test_timeout_kills_background_children_and_leaves_no_host_process(repo):
    with sandbox(repo) as sb:
        res = sb.exec(
            "(sleep 2; touch late_child) & setsid sh -c 'sleep 2; touch late_setsid' & sleep 1000 & sleep 30",
            timeout_s=1.5,
        )
        assert res.timed_out and res.exit_code == 124
        assert res.duration_s < 5
        assert host_processes_mentioning(scratch_of(sb)) == []
        time.sleep(2)
        names = {e.path for e in sb.list_files()}
    assert "late_child" not in names and "late_setsid" not in names


def test_background_process_does_not_outlive_its_command(repo):
    with sandbox(repo) as sb:
        res = sb.exec("(sleep 0.5; touch late) & sleep 1000 & echo started")
        assert host_processes_mentioning(scratch_of(sb)) == []
        time.sleep(1.0)
        assert res.stdout == "started\n"
        assert "late" not in {e.path for e in sb.list_files()}


def test_killed_host_process_leaves_no_container_running(repo, tmp_path):
    opener = (
        "import sys\n"
        "from carl.sandbox import SandboxConfig, open_sandbox\n"
        "sb = open_sandbox(sys.argv[1], SandboxConfig(backend='gvisor', scratch_dir=sys.argv[2]))\n"
        "print(sb._host.scratch.path, flush=True)\n"
        "sb.exec('touch running; sleep 1000 & sleep 1000')\n"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", opener, str(repo), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    path = host.stdout.readline().strip()
    deadline = time.monotonic() + 20
    while not (Path(path) / "workspace" / "running").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_processes_mentioning(path), "the container never started"
    host.kill()
    host.wait()
    deadline = time.monotonic() + 5
    while host_processes_mentioning(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_processes_mentioning(path) == []
    # What a SIGKILLed host leaves: its scratch directory and groups (empty: rmdir succeeds).
    sweep_stale("carl-gvisor-", tmp_path, on_stale=cgroup.remove_stale)
    name = Path(path).name
    for ctrl, own in own_groups().items():
        for group in (CGROUP_ROOT / ctrl / own.lstrip("/")).glob(f"{name}-*"):
            group.rmdir()


def test_fork_bomb_is_stopped_by_max_procs(repo):
    fork_count = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(2); os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n)\n"
    )
    with sandbox(repo, max_procs=16) as sb:
        counted = sb.exec(["python3", "-c", fork_count])
        bomb = sb.exec(":(){ :|:& };:; sleep 1", timeout_s=10)
        after = sb.exec("echo alive")
    assert 8 <= int(counted.stdout) < 16, counted
    assert "Resource temporarily unavailable" in bomb.stderr, bomb
    assert after.stdout == "alive\n"


def test_memory_is_limited_per_process_and_per_sandbox(repo):
    hog = "import sys; x = bytearray(int(sys.argv[1]) << 20); x[::4096] = bytes(len(x[::4096])); print('big')"
    with sandbox(repo, memory_mb=256) as sb:
        one = sb.exec(["python3", "-c", hog, "1024"], timeout_s=30)  # over RLIMIT_AS
        # four processes of 150 MiB each: every one is under RLIMIT_AS, together over the cgroup limit
        many = sb.exec(
            f'for i in 1 2 3 4; do python3 -c "{hog}" 150 & done; wait; echo survived', timeout_s=30
        )
    assert one.exit_code != 0 and "big" not in one.stdout and "MemoryError" in one.stderr, one
    if cgroup.available():  # the host OOM-kills the container as a whole (Sentry included)
        assert "survived" not in many.stdout, many
        assert many.exit_code == 137 and "Killed" in many.stderr, many


def test_close_deletes_the_copy_kills_running_commands_and_is_idempotent(repo, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    sb = sandbox(repo, scratch_dir=str(scratch))
    results = []
    worker = threading.Thread(target=lambda: results.append(sb.exec("sleep 1000 & sleep 30", timeout_s=60)))
    worker.start()
    time.sleep(2)
    path = scratch_of(sb)
    sb.close()
    worker.join(timeout=10)
    sb.close()
    assert results and results[0].exit_code != 0 and not results[0].timed_out
    assert list(scratch.iterdir()) == []
    assert host_processes_mentioning(path) == []
    with pytest.raises(SandboxError):
        sb.exec("true")


def test_infra_failure_is_a_sandbox_error_but_a_command_faking_one_is_not(repo, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    with sandbox(repo, ro_binds=(str(extra),)) as sb:
        faked = sb.exec("echo 'runsc: error: starting container' >&2; exit 1")
        extra.rmdir()  # its mount can no longer be made
        with pytest.raises(SandboxError, match="could not start"):
            sb.exec("true")
    assert faked.exit_code == 1 and faked.stderr.startswith("runsc: error"), faked


def test_python_env_is_usable_inside(repo):
    with sandbox(repo, python_env=str(VENV)) as sb:
        res = sb.exec("python -c 'import pytest, pkg, sys; print(pkg.VALUE + 1, sys.prefix)'")
    assert res.exit_code == 0, res
    assert res.stdout == f"42 {VENV}\n"


def test_missing_runsc_is_a_clear_error(repo, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxError, match="apt-get install runsc"):
        sandbox(repo)
