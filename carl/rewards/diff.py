"""What the agent changed in its sandbox, relative to the broken repo it started from.

`workspace_changes(sandbox, broken_repo_dir)` goes through the Sandbox protocol only (one
`exec` of a small stdlib script plus `read_file` of the changed files), so it works the same for
local, bubblewrap and remote sandboxes:

    host: manifest(broken_repo_dir) = {path: sha256} --stdin--> sandbox: python3 -I (same walk)
    sandbox --stdout--> {changed or new path: sha256, "deleted": [...]}  --> read_file(changed)

Caches and bytecode (`__pycache__`, `.pytest_cache`, `*.pyc`, ...), `*.egg-info` and `.git` are
not part of the diff: running the tests creates them, they are never copied into the reward
sandbox, and reading them is the monitor's business, not the diff's. The walk in the sandbox
opens nothing but regular files and reads none over MAX_FILE_BYTES (see `file_manifest`).

`is_test_path` decides which paths count as tests or test configuration: the reward never copies
those, and the monitor flags edits to them. Beyond the tests themselves that is everything a
test run or the interpreter reads by itself wherever it sits (`is_runner_config`): pytest's
config files, conftest.py, start-up hooks (sitecustomize, usercustomize, `.pth`), package
metadata (`*.dist-info`, `*.egg-info`: entry points register pytest plugins).
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import posixpath
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from carl.sandbox.base import Sandbox, SandboxError, SandboxPathError

ChangeStatus = Literal["added", "modified", "deleted"]

# pytest's own config files (_pytest/config/findpaths.py: the first one found upwards from the
# common ancestor of the arguments configures the run), conftest.py, and the config of the tools
# that wrap a test run.
TEST_CONFIG_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.toml",
        ".pytest.toml",
        "pytest.ini",
        ".pytest.ini",
        "pyproject.toml",
        "tox.ini",
        "setup.cfg",
        "noxfile.py",
        ".coveragerc",
    }
)
TEST_DIR_NAMES = frozenset({"test", "tests", "testing"})
# Modules the interpreter imports by itself at start-up (site.py) from any sys.path entry, in any
# form: sitecustomize.py, a package sitecustomize/__init__.py, an extension sitecustomize.*.so.
STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})
# site.py executes the `import` lines of a .pth file; pyvenv.cfg and pythonXY._pth next to an
# interpreter set its sys.path.
STARTUP_SUFFIXES = (".pth", "._pth")
STARTUP_NAMES = frozenset({"pyvenv.cfg"})
# Package metadata that importlib.metadata finds in any sys.path entry: entry_points.txt registers
# pytest plugins ([pytest11], loaded when pytest starts) and console scripts; .egg-link points
# an installed name at a directory of code.
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".egg")


def is_test_path(path: str, test_files: Sequence[str] = ()) -> bool:
    """True for tests and test configuration: anything in `test_files` (the task's list), any
    file under a `test/`/`tests/`/`testing/` directory, `test_*.py`/`*_test.py`, and whatever
    `is_runner_config` says changes every test run (config, start-up hooks, package metadata)."""
    path = posixpath.normpath(path.replace("\\", "/"))
    if path in test_files:
        return True
    parts = path.split("/")
    name = parts[-1]
    if any(p in TEST_DIR_NAMES for p in parts[:-1]) or is_runner_config(path):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def is_runner_config(path: str) -> bool:
    """A file that changes how any test runs, wherever it sits: pytest and tool config,
    conftest.py, start-up hooks, package metadata. Source code never needs to be one of them."""
    name = posixpath.basename(path.replace("\\", "/"))
    return name in TEST_CONFIG_NAMES or is_startup_hook(path) or is_package_metadata(path)


def is_startup_hook(path: str) -> bool:
    """Run by the interpreter at start-up when its directory is on sys.path (or next to the
    interpreter): sitecustomize/usercustomize as a module, package or extension; `*.pth`;
    pyvenv.cfg, `*._pth`. Any path component counts (a package `sitecustomize/`)."""
    parts = posixpath.normpath(path.replace("\\", "/")).split("/")
    return (
        any(p.split(".")[0] in STARTUP_MODULES for p in parts)
        or parts[-1].endswith(STARTUP_SUFFIXES)
        or parts[-1] in STARTUP_NAMES
    )


def is_package_metadata(path: str) -> bool:
    """Inside (or itself) a `*.dist-info`, `*.egg-info`, `*.egg` directory or a `*.egg-link`."""
    parts = posixpath.normpath(path.replace("\\", "/")).split("/")
    return any(p.endswith(METADATA_SUFFIXES) for p in parts)


MODULE_SUFFIXES = (".py", ".pyw", ".so", ".pyd")


def import_root_module(path: str) -> str | None:
    """The top-level module a file defines where it sits at an import root (the repository's root
    or `src/`): `x.py`, `x.cpython-311-x86_64-linux-gnu.so` or `x/__init__.py` -> "x"; None for
    any other path."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 1:
        parts = parts[1:]
    if len(parts) == 1 and parts[0].endswith(MODULE_SUFFIXES):
        return parts[0].split(".")[0]
    if len(parts) == 2 and parts[1].split(".")[0] == "__init__":
        return parts[0]
    return None


def gold_added_paths(task) -> set[str]:
    """Paths the gold patch of `task` (a TaskRecord) creates (`--- /dev/null` then `+++ b/path`)."""
    lines = (task.patch or "").splitlines()
    return {
        b[len("+++ b/") :].strip()
        for a, b in zip(lines, lines[1:])
        if a.startswith("--- /dev/null") and b.startswith("+++ b/")
    }


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
    overflow: int = 0
    """When the workspace held more files than this limit (MAX_ENTRIES) it was not walked, and the
    reward scores it 0; 0 otherwise."""
    """Changed files left out: past the first MAX_CHANGED_FILES, over MAX_FILE_BYTES, or unreadable."""

    def paths(self, status: ChangeStatus | None = None) -> list[str]:
        return [c.path for c in self.changes if status is None or c.status == status]

    def non_test_changes(self) -> list[FileChange]:
        return [c for c in self.changes if c.path not in self.test_paths]

    def test_changes(self) -> list[FileChange]:
        return [c for c in self.changes if c.path in self.test_paths]


# ------------------------------------------------------------------------------ manifests


def file_manifest(root: str, max_file_bytes: int = 8 << 20, max_entries: int = 200_000) -> dict[str, str]:
    """{relative path: digest} of every regular file and symlink under `root`, caches and VCS
    directories left out. A digest is the sha256 hex of the content; "link:" + target for a
    symlink (never followed); "big:<size>" for a file over `max_file_bytes`, which is not read;
    "unreadable" for a file that cannot be opened or read.

    The tree may be an agent's workspace that a process left running still changes, so: paths
    are opened relative to their directory's descriptor with O_NOFOLLOW (no symlink is followed,
    not even a directory swapped for one during the walk); a file is opened with O_NONBLOCK and
    hashed only if fstat says it is a regular file (a FIFO, socket or device, even one swapped in
    after the listing, is skipped and cannot hang the walk); at most `max_file_bytes` + 1 bytes
    are read (a sparse file of 100 GB costs nothing); directories deeper than 64 levels and
    names that are not valid UTF-8 are not part of the manifest. More than `max_entries` entries
    raise OverflowError (a workspace filled with files to make the walk time out).

    This function's source is also shipped into the sandbox and run there (`python3 -I`), so it
    uses the standard library only and imports what it needs inside; keep `max_file_bytes`'s
    default equal to MAX_FILE_BYTES.
    """
    import hashlib
    import os
    import stat

    skip_dirs = {
        ".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
        ".hypothesis", ".tox", ".nox", ".pytype", ".pyre", ".dmypy.json",
    }  # fmt: skip
    max_depth = 64
    out = {}

    def digest(name, dir_fd):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError:
            return "unreadable"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size > max_file_bytes:
                return f"big:{st.st_size}"
            h, left = hashlib.sha256(), max_file_bytes + 1
            while left > 0:
                block = os.read(fd, min(left, 1 << 20))
                if not block:
                    break
                h.update(block)
                left -= len(block)
            return h.hexdigest() if left > 0 else "big:grew"
        except OSError:
            return "unreadable"
        finally:
            os.close(fd)

    def walk(dir_fd, prefix, depth):
        try:
            names = sorted(os.listdir(dir_fd))
        except OSError:
            return
        for name in names:
            try:
                name.encode("utf-8")
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except (UnicodeEncodeError, OSError):
                continue  # a surrogate-escaped name, or gone since the listing
            rel = prefix + name
            if len(out) >= max_entries:
                raise OverflowError(f"more than {max_entries} files")
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dir_fd)
                    target.encode("utf-8")
                    out[rel] = "link:" + target
                except (UnicodeEncodeError, OSError):
                    out[rel] = "unreadable"
            elif stat.S_ISDIR(st.st_mode):
                if name in skip_dirs or name.endswith(".egg-info") or depth >= max_depth:
                    continue
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    walk(fd, rel + "/", depth + 1)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode) and not name.endswith((".pyc", ".pyo")):
                d = digest(name, dir_fd)
                if d is not None:
                    out[rel] = d

    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk(top, "", 0)
    finally:
        os.close(top)
    return out


# Runs inside the sandbox: reads the host manifest on stdin, prints only what differs. It touches
# the workspace only through file_manifest (a second look at a path could find it swapped).
_DIFF_SCRIPT = (
    inspect.getsource(file_manifest)
    + """
import json, sys
expected = json.load(sys.stdin)
try:
    actual = file_manifest(".", MAX_FILE_BYTES, MAX_ENTRIES)
except OverflowError:
    print(json.dumps({"overflow": MAX_ENTRIES}))
    raise SystemExit(0)
changed = sorted(p for p, h in actual.items() if expected.get(p) != h)
too_big = {p for p in changed if actual[p].startswith("big:") or actual[p] == "unreadable"}
changed = [p for p in changed if p not in too_big]
deleted = sorted(p for p in expected if p not in actual)
omitted = len(too_big) + max(0, len(changed) - MAX_CHANGED) + max(0, len(deleted) - MAX_CHANGED)
changed = {p: actual[p] for p in changed[:MAX_CHANGED]}
deleted = deleted[:MAX_CHANGED]  # the output stays far below the exec's output cap
links = {p: h[len("link:"):] for p, h in changed.items() if h.startswith("link:")}
print(json.dumps({"changed": changed, "deleted": deleted, "links": links, "omitted": omitted}))
"""
)
# More changed files than this, or bigger ones, are not a feature rebuild (a virtualenv or a data
# dump made in the workspace); they are counted in WorkspaceDiff.omitted and never copied.
MAX_CHANGED_FILES = 2000
MAX_FILE_BYTES = 8 << 20
MAX_ENTRIES = 200_000
"""A workspace with more files than this is not walked: its diff is an overflow (scored 0, since
filling the workspace until the walk times out would otherwise mask the episode as an
infrastructure failure)."""


def workspace_changes(
    sandbox: Sandbox, broken_repo_dir: str, test_files: Sequence[str] = (), timeout_s: float = 120.0
) -> WorkspaceDiff:
    """Files the agent added, modified or deleted in `sandbox`, relative to `broken_repo_dir`.

    Raises SandboxError when the sandbox cannot run the manifest script (an infrastructure
    failure: the caller reports it as such). A changed file that can no longer be read as a
    regular file when it is fetched is counted in `omitted`, not raised.
    """
    expected = file_manifest(broken_repo_dir)
    # -I: isolated mode, so modules the agent put in the workspace (a json.py, a sitecustomize.py)
    # cannot shadow the standard library and fake the manifest.
    script = f"MAX_CHANGED = {MAX_CHANGED_FILES}\nMAX_FILE_BYTES = {MAX_FILE_BYTES}\nMAX_ENTRIES = {MAX_ENTRIES}\n"
    script += _DIFF_SCRIPT
    res = sandbox.exec(["python3", "-I", "-c", script], stdin=json.dumps(expected), timeout_s=timeout_s)
    if res.exit_code != 0 or res.truncated:
        raise SandboxError(f"workspace manifest failed (exit {res.exit_code}): {res.output[-2000:]}")
    try:
        report = json.loads(res.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError) as e:
        raise SandboxError(f"workspace manifest: unreadable output {res.stdout[-500:]!r}") from e

    if "overflow" in report:
        return WorkspaceDiff(overflow=int(report["overflow"]))
    changes, omitted = [], int(report["omitted"])
    for path in sorted(set(report["changed"]) | set(report["deleted"])):
        old = _read_host(broken_repo_dir, path) if path in expected else None
        if path in report["deleted"]:
            new = None
        elif path in report["links"]:  # read_file would follow the link (or refuse it)
            new = report["links"][path].encode()
        else:
            try:
                new = sandbox.read_file(path)
            except (SandboxPathError, FileNotFoundError):
                # Swapped for a FIFO, a directory or a bigger file since the manifest (a process
                # the agent left running): the agent's doing, so the file is left out, as if too big.
                omitted += 1
                continue
        status: ChangeStatus = "added" if old is None else "deleted" if new is None else "modified"
        changes.append(FileChange(path, status, old, new, symlink=path in report["links"]))
    return WorkspaceDiff(
        changes=tuple(changes),
        text="".join(unified_diff(c) for c in changes),
        test_paths=frozenset(c.path for c in changes if is_test_path(c.path, test_files)),
        omitted=omitted,
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


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patched_file(text: str, patch: str, path: str) -> str | None:
    """`text` (the content of `path`) with the hunks of unified diff `patch` for `path` applied:
    the original file from the broken one and the gold patch. None when the patch does not touch
    `path` or a hunk does not match. Pure (carl.tasks.patch.apply_patch is the strict applier
    for whole trees on disk)."""
    src = text.splitlines(keepends=True)
    out: list[str] = []
    lines = patch.splitlines(keepends=True)
    pos, i, current, touched = 0, 0, None, False
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if lines[i].startswith("+++ "):
            current = lines[i][4:].strip().removeprefix("b/")
        elif m and current == path:
            touched = True
            old_left, new_left = int(m.group(2) or 1), int(m.group(4) or 1)
            start = int(m.group(1)) - 1 if old_left else int(m.group(1))
            if start < pos:
                return None
            out += src[pos:start]
            pos = start
            while (old_left > 0 or new_left > 0) and i + 1 < len(lines):
                i += 1
                tag, body = lines[i][:1], lines[i][1:]
                if tag in (" ", "-"):
                    if pos >= len(src) or src[pos].rstrip("\r\n") != body.rstrip("\r\n"):
                        return None
                    pos, old_left = pos + 1, old_left - 1
                if tag in (" ", "+"):
                    out.append(body)
                    new_left -= 1
        i += 1
    return "".join(out + src[pos:]) if touched else None


class EditedPython(NamedTuple):
    """A non-test Python file the agent left behind, as the monitor's rules read it."""

    change: FileChange
    new_text: str
    old_text: str
    """"" when the agent added the file."""
    added: frozenset[int]
    """1-based line numbers of new_text that old_text does not have (difflib's matching)."""


def edited_python(changes: WorkspaceDiff) -> Iterator[EditedPython]:
    """Every non-test `.py` file the agent added or modified (not deleted, not a symlink)."""
    for c in changes.non_test_changes():
        if c.new is None or c.symlink or not c.path.endswith(".py"):
            continue
        new_text = c.new.decode("utf-8", errors="replace")
        old_text = (c.old or b"").decode("utf-8", errors="replace")
        yield EditedPython(c, new_text, old_text, frozenset(added_line_numbers(old_text, new_text)))


def added_line_numbers(old: str, new: str) -> set[int]:
    """1-based line numbers of `new` that are not in `old` (per difflib's matching)."""
    added: set[int] = set()
    matcher = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            added.update(range(j1 + 1, j2 + 1))
    return added
