"""The diff against a hostile workspace: what counts as test config (never applied in the reward
sandbox), and a manifest walk that FIFOs, sparse giants, swapped files and deep trees cannot
hang, blow up or crash."""

from __future__ import annotations

import os
import threading
import time

import pytest
from rewards_fixture import make_task, sandbox_config

from carl.rewards.diff import MAX_ENTRIES, MAX_FILE_BYTES, file_manifest, is_test_path, workspace_changes
from carl.sandbox import open_sandbox


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_task(tmp_path_factory.mktemp("diff_hardening"))


@pytest.mark.parametrize(
    "path",
    [
        "pytest.toml",  # pytest 9 reads these too
        ".pytest.toml",
        "pkg/.pytest.ini",
        "sitecustomize/__init__.py",  # start-up hooks in package or extension form
        "usercustomize/hooks.py",
        "src/sitecustomize.cpython-311-x86_64-linux-gnu.so",
        "x._pth",
        "pyvenv.cfg",
        "evil.dist-info/entry_points.txt",  # [pytest11] registers a plugin pytest loads at start-up
        "src/evil.egg-info/entry_points.txt",
        "evil.egg-link",
        "lib/evil.egg/EGG-INFO/entry_points.txt",
    ],
)
def test_runner_config_counts_as_test(path):
    assert is_test_path(path)


@pytest.mark.parametrize(
    "path",
    ["calc/ops.py", "src/pkg/site_config.py", "pkg/customize.py", "pkg/dist_info.py", "docs/index.rst",
     "pkg/eggs.py", "README.md"],
)  # fmt: skip
def test_source_files_are_applied(path):
    assert not is_test_path(path)


def test_manifest_default_is_max_file_bytes():
    """file_manifest's source runs alone in the sandbox, so its default is a literal."""
    assert file_manifest.__defaults__ == (MAX_FILE_BYTES, MAX_ENTRIES)


def test_manifest_skips_fifos_and_never_reads_giants(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "pipe")
    with open(tmp_path / "sparse.bin", "wb") as f:
        f.truncate(100 << 30)  # 100 GB apparent size, nothing on disk
    os.symlink("pipe", tmp_path / "to_pipe")
    t0 = time.monotonic()
    manifest = file_manifest(str(tmp_path))
    assert time.monotonic() - t0 < 5
    assert manifest["sparse.bin"] == f"big:{100 << 30}"
    assert manifest["to_pipe"] == "link:pipe" and "pipe" not in manifest
    assert len(manifest["a.py"]) == 64


def test_manifest_survives_deep_trees(tmp_path):
    deep = tmp_path
    for i in range(80):
        deep = deep / f"d{i}"
        if i == 10:
            (deep.parent / "mid.py").parent.mkdir(parents=True, exist_ok=True)
            (deep.parent / "mid.py").write_text("x = 1\n")
    deep.mkdir(parents=True)
    (deep / "bottom.py").write_text("x = 2\n")
    manifest = file_manifest(str(tmp_path))
    assert any(p.endswith("d9/mid.py") for p in manifest)
    assert not any(p.endswith("bottom.py") for p in manifest)  # deeper than 64 levels: not walked


def test_hostile_workspace_gives_a_diff_not_a_hang(task):
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        sb.exec(
            "mkfifo calc/pipe && truncate -s 100G big.bin && ln -s /dev/zero zero && echo 'y = 2' > calc/y.py"
        )
        t0 = time.monotonic()
        diff = workspace_changes(sb, task.broken_repo, task.test_files, timeout_s=30)
    assert time.monotonic() - t0 < 20
    assert diff.paths() == ["calc/y.py", "zero"] and diff.omitted == 1
    assert next(c for c in diff.changes if c.path == "zero").symlink


def test_files_swapped_during_the_diff(task):
    """A process the agent left running flips a file between regular file and FIFO while the
    manifest runs and the changed files are fetched: the diff finishes every time."""
    with open_sandbox(task.broken_repo, sandbox_config("local")) as sb:
        target = os.path.join(sb.workdir, "calc", "flip.py")
        stop = threading.Event()

        def flip():
            while not stop.is_set():
                with open(target, "w") as f:
                    f.write("z = 3\n")
                os.unlink(target)
                os.mkfifo(target)
                os.unlink(target)

        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            for _ in range(5):
                diff = workspace_changes(sb, task.broken_repo, task.test_files, timeout_s=30)
                assert set(diff.paths()) <= {"calc/flip.py"} and diff.omitted <= 1
        finally:
            stop.set()
            flipper.join()


def test_patched_file_rebuilds_the_original_from_the_gold_patch():
    from carl.rewards.diff import FileChange, patched_file, unified_diff

    broken = "a\nb\n-- x\nc\n"
    original = "a\nB\n-- x\nc\nd"  # a line that looks like a header, no newline at the end
    patch = unified_diff(FileChange("p.py", "modified", b"z\n", b"y\n")) + unified_diff(
        FileChange("q/m.py", "modified", broken.encode(), original.encode())
    )
    assert patched_file(broken, patch, "q/m.py").rstrip("\n") == original
    assert patched_file("", unified_diff(FileChange("n.py", "added", None, b"x = 1\n")), "n.py") == "x = 1\n"
    assert patched_file(broken, patch, "other.py") is None  # not in the patch
    assert patched_file("changed\n", patch, "q/m.py") is None  # a hunk does not match
