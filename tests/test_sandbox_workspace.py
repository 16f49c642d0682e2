"""Workspace copies and confined file operations (shared by the local and bwrap backends)."""

import os
import stat
from pathlib import Path

import pytest

import subprocess
import sys

from carl.sandbox.base import SandboxPathError

from carl.sandbox.scratch import SMALL_TREE_ENTRIES, Scratch, copy_tree, sweep_stale
from carl.sandbox.workspace import Workspace


def make_tree(root, num_files):
    (root / "d").mkdir(parents=True)
    for i in range(num_files):
        (root / "d" / f"f{i}.txt").write_text(f"file {i}\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("d/f0.txt", root / "link")
    return root


def snapshot(root):
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            body = os.readlink(p) if os.path.islink(p) else Path(p).read_text()
            out[rel] = (stat.S_IMODE(st.st_mode), stat.S_ISLNK(st.st_mode), body)
    return out


@pytest.mark.parametrize("num_files", [3, SMALL_TREE_ENTRIES + 10])  # in-process copy, then cp -a
def test_copy_keeps_contents_modes_and_symlinks(tmp_path, num_files):
    src = make_tree(tmp_path / "src", num_files)
    copy_tree(src, tmp_path / "dst")
    assert snapshot(tmp_path / "dst") == snapshot(src)
    assert os.path.islink(tmp_path / "dst" / "link")


def test_paths_that_leave_the_workspace_are_refused_and_inside_links_are_followed(tmp_path):
    root = make_tree(tmp_path / "ws", 1)
    os.symlink("/etc/passwd", root / "abs_link")
    os.symlink("../..", root / "up_link")
    os.symlink("/ws-inside/d/f0.txt", root / "inner_abs_link")  # absolute, as commands see the workspace
    ws = Workspace(root, inner_root="/ws-inside")
    assert ws.directory("d/..") == "." and ws.directory("d") == "d"
    assert ws.read_file("link") == b"file 0\n"  # a symlink that stays inside is fine
    assert ws.read_file("inner_abs_link") == b"file 0\n"
    for bad in ("/etc/passwd", "../x", "d/../../x", "abs_link", "up_link/etc", "a\x00b"):
        with pytest.raises(SandboxPathError):
            ws.read_file(bad)
        with pytest.raises(SandboxPathError):
            ws.write_file(bad, b"x")
    with pytest.raises(SandboxPathError, match="no such file"):
        ws.read_file("missing.txt")
    with pytest.raises(SandboxPathError, match="directory"):
        ws.read_file("d")
    with pytest.raises(SandboxPathError, match="directory"):
        ws.write_file(".", b"x")
    with pytest.raises(SandboxPathError, match="not a directory"):
        ws.list_files("run.sh")
    assert not (tmp_path / "x").exists()


def test_special_and_huge_files_are_refused_without_blocking_or_reading(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    os.mkfifo(root / "pipe")  # reading a FIFO by name blocks until a writer comes: never here
    with open(root / "sparse", "wb") as f:
        f.truncate(1 << 40)  # 1 TiB apparent size, no blocks
    ws = Workspace(root, max_file_bytes=1 << 20)
    with pytest.raises(SandboxPathError, match="not a regular file"):
        ws.read_file("pipe")
    with pytest.raises(SandboxPathError, match="not a regular file"):
        ws.write_file("pipe", b"x")
    with pytest.raises(SandboxPathError, match="bytes"):
        ws.read_file("sparse")
    (root / "ok").write_bytes(b"y" * (1 << 20))
    assert len(ws.read_file("ok")) == 1 << 20


def test_a_swapping_process_never_redirects_reads_or_writes(tmp_path):
    """The race of issue 27: a sandboxed process swaps a workspace directory for a symlink to a
    host directory while the host reads and writes through it. Every operation must act inside
    the workspace or fail; none may reach the target."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.txt").write_text("HOST SECRET")
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "secret.txt").write_text("inside")
    swapper = subprocess.Popen([sys.executable, "-c", f"""
import os, time
os.chdir({str(root)!r})
end = time.time() + 3
while time.time() < end:
    os.rename("d", "d.real"); os.symlink({str(outside)!r}, "d")
    os.unlink("d"); os.rename("d.real", "d")
"""])
    ws = Workspace(root)
    seen = set()
    try:
        while swapper.poll() is None:
            for op in (lambda: ws.read_file("d/secret.txt"), lambda: ws.write_file("d/new.txt", b"agent"),
                       lambda: ws.list_files("d"), lambda: ws.write_file("d/secret.txt", b"inside")):
                try:
                    out = op()
                except SandboxPathError:
                    continue
                if isinstance(out, bytes):
                    seen.add(out)
    finally:
        swapper.kill()
    assert b"HOST SECRET" not in seen
    assert sorted(os.listdir(outside)) == ["secret.txt"] and (outside / "secret.txt").read_text() == "HOST SECRET"


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's own uid exists only on a root host")
def test_file_operations_run_with_the_sandbox_users_rights(tmp_path):
    """On a root host, the host acts on the workspace as the sandbox's uid: what that uid cannot
    read stays unread even through a hard link or a mode change, and new files are its own."""
    uid = gid = 2_999_999
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "mine.txt").write_text("agent's")
    (root / "roots.txt").write_text("root only")
    os.chmod(root / "roots.txt", 0o600)
    for p in (root, root / "d", root / "mine.txt"):
        os.chown(p, uid, gid)
    ws = Workspace(root, owner=(uid, gid))
    assert ws.read_file("mine.txt") == b"agent's"
    with pytest.raises(SandboxPathError, match="denied"):
        ws.read_file("roots.txt")
    with pytest.raises(SandboxPathError, match="denied"):
        ws.write_file("roots.txt", b"overwritten")
    ws.write_file("d/sub/new.txt", b"x")
    for p in (root / "d" / "sub", root / "d" / "sub" / "new.txt"):
        assert (os.stat(p).st_uid, os.stat(p).st_gid) == (uid, gid)
    assert (root / "roots.txt").read_text() == "root only"
    assert os.getuid() == 0 and Path("/proc/self/status").read_text().count("\t0\t0\t0\t0") == 2  # ids restored


def test_an_edit_of_the_same_size_in_the_same_second_is_not_hidden_by_a_stale_pyc(tmp_path):
    """Python reuses a .pyc whose recorded source mtime (whole seconds) and size match the file: a
    same-size edit right after a test run compiled the file must still be what runs next."""
    import py_compile
    import subprocess
    import sys
    import time

    ws = Workspace(tmp_path)
    ws.write_file("calc.py", b"def add(a, b):\n    return a - b\n")
    now = time.time()
    os.utime(tmp_path / "calc.py", (now, now))
    py_compile.compile(str(tmp_path / "calc.py"))  # what a test run leaves in __pycache__
    ws.write_file("calc.py", b"def add(a, b):\n    return a + b\n")  # same size, same second
    out = subprocess.run([sys.executable, "-c", "import calc; print(calc.add(1, 2))"], cwd=tmp_path,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


def test_scratch_dirs_of_dead_processes_are_swept_at_once(tmp_path):
    """A scratch directory whose owner was SIGKILLed is swept by the next process's first one;
    a live owner's is kept; one without a lock file (older carl) needs a dead pid and an hour."""
    made = subprocess.run([sys.executable, "-c", f"""
import os, signal
from carl.sandbox.scratch import Scratch
s = Scratch("carl-x-", {str(tmp_path)!r}, disk_mb=None)
os.makedirs(s.path / "workspace" / "ro")
os.chmod(s.path / "workspace" / "ro", 0o555)  # as a sandbox may leave it
print(s.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""], capture_output=True, text=True).stdout.strip()
    killed = Path(made)
    assert killed.is_dir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # a process id that no longer exists

    def legacy(name: str, age_s: float) -> Path:
        d = tmp_path / name
        (d / "workspace").mkdir(parents=True)
        t = os.path.getmtime(d) - age_s
        os.utime(d, (t, t))
        return d

    legacy_old = legacy(f"carl-x-{dead}-abc", 2 * 3600)
    kept = [legacy(f"carl-x-{dead}-new", 0), legacy("carl-x-nopid", 2 * 3600), legacy(f"carl-y-{dead}-z", 2 * 3600)]
    live = Scratch("carl-x-", str(tmp_path), disk_mb=None)  # sweeps as this process's first of the prefix
    try:
        assert not killed.exists() and not legacy_old.exists()
        assert all(d.exists() for d in kept)
        assert sweep_stale("carl-x-", tmp_path) == [] and live.path.exists()  # its lock is held
    finally:
        live.close()
    assert not live.path.exists()
