"""Workspace copies and confined file operations (shared by the local and bwrap backends)."""

import os
import stat
from pathlib import Path

import pytest

from carl.sandbox.base import SandboxPathError
import subprocess
import sys

from carl.sandbox.workspace import SMALL_TREE_ENTRIES, Workspace, copy_tree, make_scratch_dir, sweep_stale


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


def test_resolve_rejects_escapes_and_accepts_inside(tmp_path):
    root = make_tree(tmp_path / "ws", 1)
    os.symlink("/etc/passwd", root / "abs_link")
    os.symlink("../..", root / "up_link")
    ws = Workspace(root)
    assert ws.resolve("d/../run.sh") == root.resolve() / "run.sh"
    assert ws.read_file("link") == b"file 0\n"  # a symlink that stays inside is fine
    for bad in ("/etc/passwd", "../x", "d/../../x", "abs_link", "up_link/etc", "a\x00b"):
        with pytest.raises(SandboxPathError):
            ws.resolve(bad, must_exist=False)
    with pytest.raises(SandboxPathError, match="no such file"):
        ws.read_file("missing.txt")
    with pytest.raises(SandboxPathError, match="directory"):
        ws.read_file("d")
    with pytest.raises(SandboxPathError, match="directory"):
        ws.write_file(".", b"x")


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


def test_scratch_dirs_of_dead_processes_are_swept_once_old(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # a process id that no longer exists
    old = 2 * 3600

    def make(name: str, age_s: float) -> Path:
        d = tmp_path / name
        (d / "workspace" / "ro").mkdir(parents=True)
        (d / "workspace" / "ro" / "f.py").write_text("x")
        os.chmod(d / "workspace" / "ro", 0o555)  # as a sandbox may leave it
        t = os.path.getmtime(d) - age_s
        os.utime(d, (t, t))
        return d

    gone = make(f"carl-x-{dead}-abc", old)
    kept = [make(f"carl-x-{dead}-new", 0),  # its owner may be in another PID namespace: too young to tell
            make(f"carl-x-{os.getpid()}-me", old),  # a live owner
            make("carl-x-nopid", old),  # not a name this code makes
            make(f"carl-y-{dead}-other", old)]  # another prefix
    assert sweep_stale("carl-x-", tmp_path) == [gone]
    assert not gone.exists() and all(d.exists() for d in kept)
    # new scratch dirs carry their owner's pid, and the first one of a process sweeps its parent
    os.utime(kept[0], (os.path.getmtime(kept[0]) - old,) * 2)
    d = make_scratch_dir("carl-x-", str(tmp_path))
    assert d.name.startswith(f"carl-x-{os.getpid()}-") and not kept[0].exists()
