"""What the agent changed in its sandbox, relative to the broken repo it started from.

`workspace_changes(sandbox, broken_repo_dir)` goes through the Sandbox protocol only (one
`exec` of a small stdlib script plus `read_file` of the changed files), so it works the same for
local, bubblewrap and remote sandboxes:

    host: manifest(broken_repo_dir) = {path: sha256} --stdin--> sandbox: python3 - (same walk)
    sandbox --stdout--> {changed or new path: sha256, "deleted": [...]}  --> read_file(changed)

Caches and bytecode (`__pycache__`, `.pytest_cache`, `*.pyc`, ...) and `.git` are not part of the
diff: running the tests creates them, they are never copied into the reward sandbox, and reading
them is the monitor's business, not the diff's.

`is_test_path` decides which paths count as tests or test configuration: the reward never copies
those, and the monitor flags edits to them.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from carl.sandbox.base import Sandbox, SandboxError

ChangeStatus = Literal["added", "modified", "deleted"]

# Files that configure the test run (or run code at interpreter start-up) wherever they sit.
# `sitecustomize.py`/`usercustomize.py`/`*.pth` are imported by Python itself once the workspace is
# on sys.path, so an agent could patch pytest through them; they are treated as test config.
TEST_CONFIG_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        ".coveragerc",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
TEST_DIR_NAMES = frozenset({"test", "tests", "testing"})


def is_test_path(path: str, test_files: Sequence[str] = ()) -> bool:
    """True for tests and test configuration: anything in `test_files` (the task's list), any
    file under a `test/`/`tests/`/`testing/` directory, `test_*.py`/`*_test.py`, conftest.py,
    pytest/tox/setup.cfg/pyproject config, start-up hooks (sitecustomize, `*.pth`)."""
    path = posixpath.normpath(path.replace("\\", "/"))
    if path in test_files:
        return True
    parts = path.split("/")
    name = parts[-1]
    if any(p in TEST_DIR_NAMES for p in parts[:-1]):
        return True
    if name in TEST_CONFIG_NAMES or name.endswith(".pth"):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


@dataclass(frozen=True)
class FileChange:
    path: str
    """Relative to the workspace root, with forward slashes."""
    status: ChangeStatus
    old: bytes | None
    """Content in the broken repo (None when added)."""
    new: bytes | None
    """Content in the agent's workspace (None when deleted); a symlink's target when `symlink`."""
    symlink: bool = False
    """The agent's entry is a symbolic link (old/new then hold "link:" + target for the diff text)."""


@dataclass(frozen=True)
class WorkspaceDiff:
    changes: tuple[FileChange, ...] = ()
    """Sorted by path."""
    text: str = ""
    """The final diff: a unified diff (a/ b/ prefixes) of every change."""
    test_paths: frozenset[str] = field(default_factory=frozenset)
    """Paths in `changes` that `is_test_path` counts as tests or test config (given the task)."""
    omitted: int = 0
    """Changed files left out: past the first MAX_CHANGED_FILES, or over MAX_FILE_BYTES each."""

    def paths(self, status: ChangeStatus | None = None) -> list[str]:
        return [c.path for c in self.changes if status is None or c.status == status]

    def non_test_changes(self) -> list[FileChange]:
        return [c for c in self.changes if c.path not in self.test_paths]

    def test_changes(self) -> list[FileChange]:
        return [c for c in self.changes if c.path in self.test_paths]


# ------------------------------------------------------------------------------ manifests


def file_manifest(root: str) -> dict[str, str]:
    """{relative path: sha256 hex} of every file under `root`, caches and `.git` left out.

    Symlinks are not followed: their entry hashes "link:" + target. This function's source is
    also shipped into the sandbox and run there, so it may use the standard library only and
    must import what it needs inside.
    """
    import hashlib
    import os

    skip_dirs = {
        ".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
        ".hypothesis", ".tox", ".nox", ".pytype", ".pyre", ".dmypy.json",
    }  # fmt: skip
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        kept = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                filenames.append(d)  # a symlink to a directory is an entry, not a place to walk
            elif d not in skip_dirs and not d.endswith(".egg-info"):
                kept.append(d)
        dirnames[:] = kept
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/" + name
            if os.path.islink(full):
                out[rel] = hashlib.sha256(b"link:" + os.readlink(full).encode()).hexdigest()
                continue
            if not os.path.isfile(full):
                continue  # sockets, fifos
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[rel] = h.hexdigest()
    return out


# Runs inside the sandbox: reads the host manifest on stdin, prints only what differs.
_DIFF_SCRIPT = (
    inspect.getsource(file_manifest)
    + """
import json, os, sys
expected = json.load(sys.stdin)
actual = file_manifest(".")
changed = sorted(p for p, h in actual.items() if expected.get(p) != h)
too_big = {p for p in changed if not os.path.islink(p) and os.path.getsize(p) > MAX_FILE_BYTES}
changed = [p for p in changed if p not in too_big]
omitted = len(too_big) + max(0, len(changed) - MAX_CHANGED)
changed = {p: actual[p] for p in changed[:MAX_CHANGED]}
deleted = sorted(p for p in expected if p not in actual)
links = {p: os.readlink(p) for p in changed if os.path.islink(p)}
print(json.dumps({"changed": changed, "deleted": deleted, "links": links, "omitted": omitted}))
"""
)
# More changed files than this, or bigger ones, are not a feature rebuild (a virtualenv or a data
# dump made in the workspace); they are counted in WorkspaceDiff.omitted and never copied.
MAX_CHANGED_FILES = 2000
MAX_FILE_BYTES = 8 << 20


def workspace_changes(
    sandbox: Sandbox, broken_repo_dir: str, test_files: Sequence[str] = (), timeout_s: float = 120.0
) -> WorkspaceDiff:
    """Files the agent added, modified or deleted in `sandbox`, relative to `broken_repo_dir`.

    Raises SandboxError when the sandbox cannot run the manifest script (an infrastructure
    failure: the caller reports it as such).
    """
    expected = file_manifest(broken_repo_dir)
    # -I: isolated mode, so modules the agent put in the workspace (a json.py, a sitecustomize.py)
    # cannot shadow the standard library and fake the manifest.
    script = f"MAX_CHANGED = {MAX_CHANGED_FILES}\nMAX_FILE_BYTES = {MAX_FILE_BYTES}\n" + _DIFF_SCRIPT
    res = sandbox.exec(["python3", "-I", "-c", script], stdin=json.dumps(expected), timeout_s=timeout_s)
    if res.exit_code != 0 or res.truncated:
        raise SandboxError(f"workspace manifest failed (exit {res.exit_code}): {res.output[-2000:]}")
    try:
        report = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        raise SandboxError(f"workspace manifest: unreadable output {res.stdout[-500:]!r}") from e

    changes = []
    for path in sorted(set(report["changed"]) | set(report["deleted"])):
        old = _read_host(broken_repo_dir, path) if path in expected else None
        if path in report["deleted"]:
            new = None
        elif path in report["links"]:  # read_file would follow the link (or refuse it)
            new = report["links"][path].encode()
        else:
            new = sandbox.read_file(path)
        status: ChangeStatus = "added" if old is None else "deleted" if new is None else "modified"
        changes.append(FileChange(path, status, old, new, symlink=path in report["links"]))
    return WorkspaceDiff(
        changes=tuple(changes),
        text="".join(unified_diff(c) for c in changes),
        test_paths=frozenset(c.path for c in changes if is_test_path(c.path, test_files)),
        omitted=int(report["omitted"]),
    )


def unified_diff(change: FileChange) -> str:
    """One file's unified diff (git-style a/ b/ headers; /dev/null for added or deleted)."""
    a = "/dev/null" if change.old is None else f"a/{change.path}"
    b = "/dev/null" if change.new is None else f"b/{change.path}"
    new = b"link:" + change.new if change.symlink and change.new is not None else change.new
    old_text, new_text = _text(change.old), _text(new)
    if old_text is None or new_text is None:
        return f"Binary files {a} and {b} differ\n"
    lines = difflib.unified_diff(
        old_text.splitlines(keepends=True), new_text.splitlines(keepends=True), fromfile=a, tofile=b
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _text(data: bytes | None) -> str | None:
    """Decoded text; "" for an absent file; None for binary content."""
    if data is None:
        return ""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_host(root: str, path: str) -> bytes:
    full = os.path.join(root, path)
    if os.path.islink(full):
        return b"link:" + os.readlink(full).encode()
    with open(full, "rb") as f:
        return f.read()
