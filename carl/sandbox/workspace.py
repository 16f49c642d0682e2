"""File operations on a sandbox's workspace from the host: confined to it, and never done with
more privilege than the sandbox's own user.

The local, bwrap and gvisor backends keep the workspace as a host directory and serve
read_file / write_file / list_files directly on it (no process start: tools that only read files
stay cheap). The agent's processes may run while they do: the harness runs the calls of one
message in parallel, so a command can swap a directory of the workspace for a symlink between
a check and a use. So no path is ever resolved first and opened by name afterwards:

- Every operation walks the path from the workspace root one component at a time, with
  openat(O_NOFOLLOW | O_DIRECTORY) on directory fds it holds. A symlink is read (readlinkat) and
  its target walked the same way; a target that leaves the workspace (`..` past the root, an
  absolute path outside the workspace as commands see it) is an error. A component swapped for
  a symlink after it was checked makes the next open fail (ELOOP), never leads elsewhere.
- When the sandbox runs as a uid of its own (a host running as root), the calling thread takes
  that uid and gid as its filesystem ids for the whole operation (setfsuid/setfsgid act on one
  thread). The kernel then checks every access as it would for the sandbox's user and drops
  root's file capabilities (DAC override, chown, fowner), so even a confinement bug could not
  read or write what the sandbox user cannot; files made get that owner with no chown.
- Only regular files are read or written: opened with O_NONBLOCK and checked with fstat, so a
  FIFO neither blocks the host nor is read, and a file larger than `max_file_bytes` is refused
  before any byte is read (a sparse file of any apparent size never reaches the host's memory).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from carl.sandbox.base import FileEntry, SandboxError, SandboxPathError

MAX_SYMLINK_HOPS = 40
"""Symlinks followed while resolving one path (as the kernel's own limit)."""
MAX_LIST_ENTRIES = 100_000
"""A listing with more entries than this is refused (a workspace the agent filled with files)."""
MAX_LIST_DEPTH = 64
"""A recursive listing does not descend deeper than this."""
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)
_libc.setfsuid.argtypes = [ctypes.c_uint]
_libc.setfsgid.argtypes = [ctypes.c_uint]
_QUERY = 0xFFFFFFFF  # setfs[ug]id(-1) fails and returns the current id


class Workspace:
    """File operations on a host directory, confined to it (see the module docstring).

    owner: (uid, gid) of the sandbox's user when it is not the host process's own (a root host);
    every operation then runs with those filesystem ids. None: the host process's own ids.
    inner_root: the workspace's path as commands see it (e.g. "/workspace"); absolute symlinks
    under it are followed inside the workspace.
    """

    def __init__(
        self,
        root: Path,
        owner: tuple[int, int] | None = None,
        *,
        inner_root: str | None = None,
        max_file_bytes: int = 32 << 20,
    ):
        self.root = root.resolve()
        self.owner = owner
        self.inner_root = (inner_root or str(self.root)).rstrip("/")
        self.max_file_bytes = max_file_bytes

    # -- the operations -------------------------------------------------------------------------

    def read_file(self, path: str) -> bytes:
        with self._at(path) as (dir_fd, name, rel):
            if not name:
                raise SandboxPathError(f"{path!r} is a directory, not a file")
            fd = self._open_file(dir_fd, name, rel, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size > self.max_file_bytes:
                    raise SandboxPathError(
                        f"{rel!r} is {size} bytes; files over {self.max_file_bytes} bytes are not read"
                    )
                chunks, total = [], 0
                while chunk := os.read(fd, min(1 << 20, self.max_file_bytes + 1 - total)):
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > self.max_file_bytes:  # it grew while being read
                        raise SandboxPathError(f"{rel!r} grew past {self.max_file_bytes} bytes while being read")
                return b"".join(chunks)
            finally:
                os.close(fd)

    def write_file(self, path: str, data: bytes) -> None:
        with self._at(path, make_dirs=True) as (dir_fd, name, rel):
            if not name:
                raise SandboxPathError(f"{path!r} is a directory, not a file")
            try:
                before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                before = None
            fd = self._open_file(dir_fd, name, rel, os.O_WRONLY | os.O_CREAT)
            try:
                os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if before is not None and int(os.fstat(fd).st_mtime) == int(before.st_mtime):
                    # Python trusts a .pyc whose recorded source mtime (whole seconds) and size match:
                    # an edit of the same size within the second a test run compiled the file would
                    # run the old code. Move the mtime to the next second so compiled copies go stale.
                    next_s_ns = (int(before.st_mtime) + 1) * 1_000_000_000
                    os.utime(fd, ns=(next_s_ns, next_s_ns))
            except OSError as e:
                raise SandboxPathError(f"cannot write {rel!r}: {e.strerror}") from e
            finally:
                os.close(fd)

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        with self._at(path) as (dir_fd, name, rel):
            fd = self._open_dir(dir_fd, name, rel) if name else os.dup(dir_fd)
            try:
                entries: list[FileEntry] = []
                self._scan(fd, "" if rel == "." else rel + "/", recursive, 0, entries)
                return entries
            finally:
                os.close(fd)

    def directory(self, path: str) -> str:
        """The workspace-relative path ("." for the root) of the directory `path` names, symlinks
        resolved inside the workspace; SandboxPathError when it leaves, is missing or is no directory."""
        with self._at(path) as (dir_fd, name, rel):
            if name:
                os.close(self._open_dir(dir_fd, name, rel))
            return rel

    # -- confinement ----------------------------------------------------------------------------

    @contextmanager
    def _at(self, path: str, *, make_dirs: bool = False) -> Iterator[tuple[int, str, str]]:
        """(fd of the directory holding the target, the target's name in it, its workspace-relative
        path), symlinks resolved inside the workspace, with the sandbox user's filesystem ids.
        The name is "" when the target is a directory reached by the walk itself (the root, `..`)."""
        pending = _parts(path)
        root_fd = os.open(self.root, _O_DIR)  # as the host: the scratch dir above is not the sandbox's
        fds, names, hops = [root_fd], [], 0
        try:
            with _filesystem_ids(self.owner), _as_path_error(path):
                while pending:
                    name = pending.pop(0)
                    if name == "..":
                        if not names:
                            raise SandboxPathError(f"path {path!r} leaves the workspace")
                        os.close(fds.pop())
                        names.pop()
                        continue
                    st = _lstat(name, fds[-1])
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        hops += 1
                        if hops > MAX_SYMLINK_HOPS:
                            raise SandboxPathError(f"path {path!r}: too many levels of symbolic links")
                        target = os.readlink(name, dir_fd=fds[-1])
                        if target.startswith("/"):
                            target = self._inside(target, path)
                            while len(fds) > 1:
                                os.close(fds.pop())
                            names.clear()
                        pending[:0] = _parts(target, link=True)
                        continue
                    if not pending:
                        yield fds[-1], name, "/".join([*names, name])
                        return
                    if st is None:
                        if not make_dirs:
                            raise SandboxPathError(f"no such file or directory: {path!r}")
                        try:
                            os.mkdir(name, 0o755, dir_fd=fds[-1])
                        except OSError as e:
                            raise SandboxPathError(f"cannot make directory {'/'.join([*names, name])!r}: {e.strerror}") from e
                    fds.append(self._open_dir(fds[-1], name, "/".join([*names, name])))
                    names.append(name)
                yield fds[-1], "", "/".join(names) or "."
        finally:
            for fd in fds:
                os.close(fd)

    def _inside(self, target: str, path: str) -> str:
        """An absolute symlink target as a workspace-relative one, or an error if it leads outside."""
        if target == self.inner_root or target.startswith(self.inner_root + "/"):
            return target[len(self.inner_root) :].lstrip("/") or "."
        raise SandboxPathError(f"path {path!r} leaves the workspace (a symlink to {target!r})")

    def _open_dir(self, dir_fd: int, name: str, rel: str) -> int:
        try:
            return os.open(name, _O_DIR, dir_fd=dir_fd)
        except FileNotFoundError:
            raise SandboxPathError(f"no such file or directory: {rel!r}") from None
        except NotADirectoryError:
            raise SandboxPathError(f"{rel!r} is not a directory") from None
        except OSError as e:
            if e.errno == errno.ELOOP:  # was checked, then swapped for a symlink
                raise SandboxPathError(f"{rel!r} changed while being opened; try again") from None
            raise SandboxPathError(f"cannot open {rel!r}: {e.strerror}") from None

    def _open_file(self, dir_fd: int, name: str, rel: str, flags: int) -> int:
        """A regular file, opened relative to dir_fd; anything else is refused without blocking."""
        try:
            fd = os.open(name, flags | _O_FILE, 0o644, dir_fd=dir_fd)
        except FileNotFoundError:
            raise SandboxPathError(f"no such file or directory: {rel!r}") from None
        except IsADirectoryError:
            raise SandboxPathError(f"{rel!r} is a directory, not a file") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise SandboxPathError(f"{rel!r} changed while being opened; try again") from None
            if e.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
                raise SandboxPathError(f"{rel!r} is not a regular file") from None
            raise SandboxPathError(f"cannot open {rel!r}: {e.strerror}") from None
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            what = "a directory, not a file" if stat.S_ISDIR(mode) else "not a regular file"
            raise SandboxPathError(f"{rel!r} is {what}")
        return fd

    def _scan(self, fd: int, prefix: str, recursive: bool, depth: int, out: list[FileEntry]) -> None:
        """Append the entries of the open directory fd (dirs, then files, each sorted; then each
        subdirectory's entries when recursive), as os.walk orders them. Runs inside `_at`, so
        with the sandbox user's filesystem ids."""
        with os.scandir(fd) as it:
            found = [(e.name, e.stat(follow_symlinks=False)) for e in it]
        dirs = sorted((n, st) for n, st in found if stat.S_ISDIR(st.st_mode))
        files = sorted((n, st) for n, st in found if not stat.S_ISDIR(st.st_mode))
        out += [FileEntry(prefix + n, True, 0) for n, _ in dirs]
        out += [FileEntry(prefix + n, False, st.st_size) for n, st in files]
        if len(out) > MAX_LIST_ENTRIES:
            raise SandboxPathError(f"more than {MAX_LIST_ENTRIES} entries; list a smaller directory")
        if not recursive or depth >= MAX_LIST_DEPTH:
            return
        for name, _ in dirs:
            try:
                sub = os.open(name, _O_DIR, dir_fd=fd)
            except OSError:  # unreadable for the sandbox user, or swapped meanwhile: not listed
                continue
            try:
                self._scan(sub, f"{prefix}{name}/", recursive, depth + 1, out)
            finally:
                os.close(sub)


def _parts(path: str, link: bool = False) -> list[str]:
    """The components of a relative path ("." and empty ones dropped; ".." kept for the walk)."""
    if not isinstance(path, str) or "\x00" in path:
        raise SandboxPathError(f"bad path {path!r}")
    if path.startswith("/") and not link:
        raise SandboxPathError(f"path {path!r} is absolute; give a path relative to the workspace")
    return [p for p in path.split("/") if p not in ("", ".")]


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@contextmanager
def _as_path_error(path: str) -> Iterator[None]:
    """An OSError of the walk or of the operation on its result (permission denied, no space
    left, a name too long) is a problem with the path, shown to the agent; not a crash."""
    try:
        yield
    except SandboxPathError:
        raise
    except OSError as e:
        raise SandboxPathError(f"{path!r}: {e.strerror or e}") from None


@contextmanager
def _filesystem_ids(owner: tuple[int, int] | None) -> Iterator[None]:
    """Run the block with owner's uid and gid as this thread's filesystem ids (then restore them)."""
    if owner is None:
        yield
        return
    uid, gid = owner
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        if _libc.setfsuid(_QUERY) != uid or _libc.setfsgid(_QUERY) != gid:
            raise SandboxError(f"could not take the sandbox user's filesystem ids ({uid}:{gid})")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)
