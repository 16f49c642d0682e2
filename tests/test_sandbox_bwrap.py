"""Adversarial tests of the bwrap sandbox, one property each."""

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from carl.sandbox import SandboxConfig, SandboxError, SandboxPathError, open_sandbox
from carl.sandbox.bwrap import bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap not installed")
VENV = Path(sys.prefix)


@pytest.fixture
def repo(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 41\n")
    (src / "README.md").write_text("hello\n")
    return src


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def sandbox(repo, **kw):
    return open_sandbox(repo, SandboxConfig(backend="bwrap", **kw))


def test_runs_in_workspace_copy_as_unprivileged_user(repo):
    with sandbox(repo) as sb:
        res = sb.exec("pwd; cat README.md; id -u")
    pwd, readme, uid = res.stdout.split("\n")[:3]
    assert res.exit_code == 0, res
    assert (pwd, readme) == ("/workspace", "hello")
    if os.geteuid() == 0:
        assert int(uid) != 0


def test_no_privileges_to_gain(repo):
    with sandbox(repo) as sb:
        res = sb.exec(
            "grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status; grep ' /usr ' /proc/self/mountinfo"
        )
    lines = res.stdout.splitlines()
    assert lines[:3] == ["CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"], res
    assert "nosuid" in lines[3]  # setuid binaries in /usr give nothing either


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


def test_cannot_write_outside_workspace(repo, tmp_path):
    marker = f"carl-escape-{os.getpid()}"
    with sandbox(repo) as sb:
        res = sb.exec(
            f"for d in / /usr /etc /home /root /var /tmp/../usr; do touch $d/{marker} 2>/dev/null && echo wrote $d; done;"
            f"touch /tmp/{marker} && echo tmp ok"
        )
    assert "wrote" not in res.stdout, res
    assert "tmp ok" in res.stdout  # the private /tmp is writable ...
    assert not (Path("/tmp") / marker).exists()  # ... and is not the host's /tmp
    for d in ("/", "/usr", "/etc", "/var"):
        assert not (Path(d) / marker).exists()


def test_cannot_see_host_dirs_not_bound(repo, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("s3cret")
    with sandbox(repo) as sb:
        res = sb.exec(
            f"cat {secret} 2>&1; ls -A /root /home {Path(__file__).parent} 2>&1; "
            f"grep -rl s3cret / --exclude-dir=proc --exclude-dir=usr 2>/dev/null; echo done"
        )
    assert "s3cret" not in res.stdout.replace(str(secret), ""), res
    assert "No such file" in res.stdout
    assert "test_sandbox_bwrap.py" not in res.stdout
    assert res.stdout.rstrip().endswith("done")


def test_process_limit_counts_only_this_sandbox(repo):
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
    with sandbox(repo, max_procs=16) as a, sandbox(repo, max_procs=16) as b:
        res_a = a.exec(["python3", "-c", fork_count])
        res_b = b.exec(["python3", "-c", fork_count])
    assert 8 <= int(res_a.stdout) < 16, res_a  # capped, but not by the host's other processes
    assert 8 <= int(res_b.stdout) < 16, res_b


def test_fork_bomb_is_stopped_and_host_is_fine(repo):
    with sandbox(repo, max_procs=32) as sb:
        start = time.monotonic()
        res = sb.exec(":(){ :|:& };:; sleep 1", timeout_s=3)
        assert time.monotonic() - start < 10
        after = sb.exec("echo alive")
    assert "Resource temporarily unavailable" in res.stderr  # the process limit was hit
    assert after.stdout == "alive\n"
    assert subprocess.run(["true"], check=False).returncode == 0


def test_memory_hog_is_stopped(repo):
    with sandbox(repo, memory_mb=256) as sb:
        res = sb.exec(
            ["python3", "-c", "x = bytearray(1024 * 1024 * 1024); print('allocated')"], timeout_s=20
        )
    assert res.exit_code != 0
    assert "allocated" not in res.stdout
    assert "MemoryError" in res.stderr


def test_timeout_kills_children_and_setsid_escapees(repo):
    with sandbox(repo) as sb:
        res = sb.exec(
            "(sleep 1; touch late_child) & setsid bash -c 'sleep 1; touch late_setsid' & sleep 30",
            timeout_s=0.5,
        )
        assert res.timed_out and res.exit_code == 124
        assert res.duration_s < 3
        time.sleep(1.5)
        names = {e.path for e in sb.list_files()}
    assert "late_child" not in names and "late_setsid" not in names


def test_background_process_does_not_outlive_its_command(repo):
    with sandbox(repo) as sb:
        res = sb.exec("(sleep 0.5; touch late) & echo started")
        time.sleep(1.0)
        assert res.stdout == "started\n"
        assert "late" not in {e.path for e in sb.list_files()}


def test_source_untouched_after_edits(repo):
    before = tree_digest(repo)
    with sandbox(repo) as sb:
        sb.write_file("pkg/__init__.py", b"VALUE = 0\n")
        sb.write_file("new/file.txt", b"x")
        res = sb.exec("rm README.md && echo extra >> pkg/__init__.py && mkdir more && chmod 000 more")
        assert res.exit_code == 0, res
    assert tree_digest(repo) == before


def test_two_sandboxes_do_not_see_each_others_edits(repo):
    with sandbox(repo) as a, sandbox(repo) as b:
        a.write_file("README.md", b"from a\n")
        a.exec("echo a > only_a.txt; echo a > /tmp/only_a.txt")
        assert b.read_file("README.md") == b"hello\n"
        res = b.exec("ls only_a.txt /tmp/only_a.txt 2>&1")
    assert res.exit_code != 0 and "No such file" in res.stdout


def test_paths_cannot_escape_the_workspace(repo, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")
    with sandbox(repo) as sb:
        sb.exec(f"ln -s {outside} link_abs; ln -s ../../../../../../{outside} link_rel; ln -s /etc link_dir")
        for bad in ("../outside.txt", str(outside), "link_abs", "link_rel", "link_dir/passwd"):
            with pytest.raises(SandboxPathError):
                sb.read_file(bad)
        with pytest.raises(SandboxPathError):
            sb.write_file("link_dir/evil", b"x")
        with pytest.raises(SandboxPathError):
            sb.exec("true", cwd="..")
    assert outside.read_text() == "host file"


def test_files_round_trip_and_are_writable_inside(repo):
    with sandbox(repo) as sb:
        sb.write_file("a/b/c.txt", b"one\n")
        assert sb.read_file("a/b/c.txt") == b"one\n"
        res = sb.exec("echo two >> c.txt && touch d.txt && cat c.txt", cwd="a/b")
        assert res.stdout == "one\ntwo\n", res
        assert [e.path for e in sb.list_files("a/b")] == ["a/b/c.txt", "a/b/d.txt"]
        assert {"pkg", "pkg/__init__.py", "a/b/c.txt"} <= {e.path for e in sb.list_files(recursive=True)}


def test_python_env_ruff_and_rg_work_inside(repo):
    with sandbox(repo, python_env=str(VENV)) as sb:
        res = sb.exec(
            "python -c 'import pkg, sys; print(pkg.VALUE + 1, sys.prefix)' && ruff --version && rg -l VALUE"
        )
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    assert lines[0] == f"42 {VENV}"
    assert lines[1].startswith("ruff ")
    assert lines[2] == "pkg/__init__.py"


def test_output_is_capped_stdin_and_exit_codes_pass_through(repo):
    with sandbox(repo, max_output_bytes=1000) as sb:
        big = sb.exec("yes | head -c 100000")
        cat = sb.exec(["cat"], stdin="piped in")
        code = sb.exec("exit 7")
    assert big.truncated and big.stdout.startswith("y\ny\n") and "99000 more bytes" in big.stdout
    assert cat.stdout == "piped in"
    assert code.exit_code == 7


def test_close_kills_a_command_running_in_another_thread(repo):
    sb = sandbox(repo)
    results = []
    worker = threading.Thread(target=lambda: results.append(sb.exec("sleep 30", timeout_s=60)))
    worker.start()
    time.sleep(0.5)
    start = time.monotonic()
    sb.close()
    worker.join(timeout=10)
    assert results and results[0].exit_code != 0 and not results[0].timed_out
    assert time.monotonic() - start < 5


def test_closed_sandbox_refuses_and_close_is_idempotent(repo):
    sb = sandbox(repo)
    sb.exec("true")
    sb.close()
    sb.close()
    with pytest.raises(SandboxError):
        sb.exec("true")


def test_copies_live_in_scratch_dir_and_are_deleted(repo, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with sandbox(repo, scratch_dir=str(scratch)) as sb:
        sb.exec("touch made_inside")
        assert list(scratch.glob("*/workspace/made_inside"))
    assert list(scratch.iterdir()) == []
    with pytest.raises(SandboxError, match="scratch_dir"):
        sandbox(repo, scratch_dir=str(tmp_path / "missing"))


def test_bwrap_setup_failure_is_a_sandbox_error_not_a_command_result(repo, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir()
    with sandbox(repo, ro_binds=(str(extra),)) as sb:
        assert sb.exec(["ls", str(extra)]).exit_code == 0
        extra.rmdir()
        with pytest.raises(SandboxError, match="could not start"):
            sb.exec("true")
    with sandbox(repo) as sb:  # a command that only prints what bwrap would is the command's result
        res = sb.exec("echo 'bwrap: cannot find source path' >&2; exit 1")
    assert res.exit_code == 1 and res.stderr.startswith("bwrap:")


def test_bad_python_env_is_a_clear_error(repo, tmp_path):
    with pytest.raises(SandboxError, match="python_env"):
        sandbox(repo, python_env=str(tmp_path))
