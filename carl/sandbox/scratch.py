"""A sandbox's scratch directory on the host: made, owned, size-limited, copied into, swept.

    <parent>/<prefix><pid>-<random>/      0700, the host process's own (never the sandbox user's)
        .owner.lock    flock'ed by the owning process for as long as the sandbox is open
        workspace/     the private copy of the repository (the sandbox user's)
        tmp/ shm/      the sandbox's /tmp and /dev/shm (the sandbox user's)
        etc/           files the backend generates for the sandbox (passwd, group, hosts)

Disk quota: with `disk_mb` and a host running as root, the scratch directory is a tmpfs mount of
that size, so the workspace and /tmp together cannot grow past it (writes fail with ENOSPC) and
closing the sandbox frees it at once. The copy then lives in memory: what the sandbox writes is
charged to its memory cgroup, the initial copy to the host process. Without root, or where root
may not mount (a container without CAP_SYS_ADMIN; warned once), there is no quota: the directory
is a plain one on the parent's filesystem.

Crash cleanup: a host process killed without its cleanup (SIGKILL, the OOM killer) leaves its
scratch directories behind. Each one holds `.owner.lock`, locked by its owner (the lock dies with
the process, whatever killed it), so the first scratch directory a process makes removes every
directory of the same prefix whose lock it can take: a restarted server cleans up at once.
Directories without a lock file (made by an older carl) are removed when their owner pid is gone
and they are over an hour old.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from carl.sandbox.base import SandboxError

LOCK_NAME = ".owner.lock"
LEGACY_STALE_AFTER_S = 3600.0
"""A scratch directory without a lock file whose owner pid is gone and that is older than this is swept."""
_MNT_DETACH = 2
_swept: set[tuple[str, str]] = set()  # (prefix, parent) pairs this process has swept
_sweep_lock = threading.Lock()
_libc = ctypes.CDLL(None, use_errno=True)
_warned_no_quota = False


def scratch_prefix(backend: str) -> str:
    """The name prefix of a backend's scratch directories (its sweep finds them by it)."""
    return f"carl-{backend}-"


class Scratch:
    """One sandbox's scratch directory (see the module docstring); `close()` removes it."""

    def __init__(
        self, prefix: str, parent: str | None, disk_mb: int | None, on_stale: Callable[[str], None] | None = None
    ):
        """prefix: e.g. "carl-bwrap-"; parent: directory to make it in (default: the temp dir);
        disk_mb: size of the tmpfs quota (root hosts; None: no quota); on_stale(name): called for
        every stale directory swept (the backend removes what else it made under that name)."""
        parent_dir = Path(parent or tempfile.gettempdir())
        sweep_once(prefix, parent_dir, on_stale)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent_dir))
        except OSError as e:
            raise SandboxError(f"sandbox.scratch_dir: cannot make a directory in {str(parent_dir)!r}: {e}") from e
        self.name = self.path.name
        self.quota_mb = 0
        self._lock_fd = -1
        try:
            if disk_mb is not None and os.geteuid() == 0 and _mount_tmpfs(self.path, disk_mb):
                self.quota_mb = disk_mb
            # Locked under another name, then renamed: a sweeper never finds it present and unlocked.
            self._lock_fd = os.open(self.path / ".lock.new", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            os.rename(self.path / ".lock.new", self.path / LOCK_NAME)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Unmount and delete the directory; idempotent."""
        try:
            remove_scratch(self.path)
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # after the removal: a sweeper never sees it unlocked and present
                self._lock_fd = -1


def sweep_once(prefix: str, parent: Path, on_stale: Callable[[str], None] | None = None) -> None:
    """sweep_stale, the first time this process asks for (prefix, parent)."""
    with _sweep_lock:
        if (prefix, str(parent)) in _swept:
            return
        _swept.add((prefix, str(parent)))
    sweep_stale(prefix, parent, on_stale)


def sweep_stale(prefix: str, parent: Path, on_stale: Callable[[str], None] | None = None) -> list[Path]:
    """Remove the `<prefix><pid>-*` directories under `parent` whose owner is gone; returns them."""
    removed = []
    for path in parent.glob(f"{prefix}*-*"):
        try:
            if path.is_symlink() or not path.is_dir() or not _is_stale(path, prefix):
                continue
        except OSError:
            continue
        if on_stale is not None:
            on_stale(path.name)
        remove_scratch(path)
        removed.append(path)
    return removed


def _is_stale(path: Path, prefix: str) -> bool:
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:  # made by a carl without lock files: fall back on pid and age
        pid = path.name[len(prefix):].split("-", 1)[0]
        age_s = time.time() - path.lstat().st_mtime
        return pid.isdigit() and not _alive(int(pid)) and age_s > LEGACY_STALE_AFTER_S
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its owner holds the lock: alive
    finally:
        os.close(fd)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_scratch(path: Path) -> None:
    """Unmount (when it is a quota mount) and delete a scratch directory."""
    if os.path.ismount(path):
        if _libc.umount2(os.fsencode(path), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            raise SandboxError(f"cannot unmount the sandbox quota at {path}: {os.strerror(err)}")
    remove_tree(path)


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a tmpfs of size_mb on path; False (with a warning, once) where mounting is not allowed
    (a root without CAP_SYS_ADMIN, e.g. in a container): the sandbox then has no disk quota."""
    global _warned_no_quota
    opts = f"size={size_mb}m,mode=0700,uid=0,gid=0".encode()
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV
    if _libc.mount(b"carl-sandbox", os.fsencode(path), b"tmpfs", flags, opts) == 0:
        return True
    if not _warned_no_quota:
        _warned_no_quota = True
        warnings.warn(f"carl sandbox: cannot mount a tmpfs for the disk quota ({os.strerror(ctypes.get_errno())}); "
                      "sandboxes run without one", stacklevel=4)
    return False


def remove_tree(root: Path) -> None:
    """rmtree that also removes directories the sandbox made read-only (chmod 555)."""

    def make_writable_and_retry(func, path, _exc):
        parent = os.path.dirname(path)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            func(path)
        except OSError:
            pass

    if os.path.lexists(root):
        shutil.rmtree(root, onerror=make_writable_and_retry)


SMALL_TREE_ENTRIES = 200
"""Trees with fewer entries are copied in-process; bigger ones by `cp -a` (see copy_tree)."""


def copy_tree(source: Path, dest: Path) -> None:
    """Copy source's contents into the new directory dest (symlinks kept as links, modes kept).

    Measured on a loaded 2-core machine: for ~20 files shutil.copytree beats `cp -a` by about 2x
    (no process start); for ~300 files `cp -a` (copying in C, reflinks where the filesystem has
    them) wins by about 1.7x. So small trees are copied in-process and big ones by cp.
    Only regular files, directories and symlinks are copied: a FIFO or device node in the source
    would hang or expose the host, so it is left out.
    """
    if not source.is_dir():
        raise SandboxError(f"sandbox source {str(source)!r} is not a directory")
    cp = shutil.which("cp")
    try:
        if cp is None or _is_small(source, SMALL_TREE_ENTRIES):
            shutil.copytree(source, dest, symlinks=True, ignore=_special_files)
            return
    except (OSError, shutil.Error) as e:
        raise SandboxError(f"copying {source} into the sandbox failed: {e}") from e
    argv = [cp, "-a", "--reflink=auto", "--no-target-directory", str(source), str(dest)]
    res = subprocess.run(argv, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        raise SandboxError(f"copying {source} into the sandbox failed: {res.stderr.strip()}")
    _remove_special_files(dest)


def _special_files(directory: str, names: list[str]) -> set[str]:
    out = set()
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            out.add(name)
    return out


def _remove_special_files(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in _special_files(dirpath, filenames):
            os.unlink(os.path.join(dirpath, name))


def _is_small(root: Path, limit: int) -> bool:
    """Whether the tree under root has fewer than limit entries (stops counting at limit)."""
    count, stack = 0, [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                count += 1
                if count >= limit:
                    return False
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return True


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give every file under root (root included, symlinks themselves) to uid:gid."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)
