"""What an isolating backend (bwrap, gvisor) keeps on the host for one sandbox.

    HostSide(source_dir, config, inner_root)
        uid lease      a host uid of the sandbox's own (root hosts; see _UidLease)
        scratch        carl.sandbox.scratch.Scratch: the copy, /tmp, generated /etc files,
                       a tmpfs of config.disk_mb (root hosts)
        cgroup         carl.sandbox.cgroup.SandboxCgroup: memory, process and CPU limits of the
                       sandbox as a whole (where the host can make cgroups)
        workspace      carl.sandbox.workspace.Workspace: confined file operations, done with the
                       sandbox user's filesystem ids

Each backend only adds how it starts a command inside (bwrap.py, gvisor.py); the local backend,
which isolates nothing, uses the scratch directory and the Workspace alone.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import tempfile
from pathlib import Path

from carl.sandbox import cgroup
from carl.sandbox.base import SandboxConfig, SandboxError
from carl.sandbox.cgroup import SandboxCgroup
from carl.sandbox.scratch import Scratch, chown_tree, copy_tree, scratch_prefix, sweep_once
from carl.sandbox.workspace import Workspace

UID_BASE, UID_COUNT = 2_000_000, 1_000_000
"""Range of host uids leased to sandboxes when the host runs as root (far from real users)."""
USER = "agent"
"""The sandbox user's name (in the generated /etc/passwd, $USER and $LOGNAME)."""
HOSTNAME = "sandbox"
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "os-release",
    "mime.types", "protocols", "services", "ssl", "ca-certificates", "gai.conf", "host.conf",
    "bash.bashrc", "inputrc", "magic", "magic.mime",
)  # fmt: skip
"""Host /etc entries shown read-only inside (when they exist); the rest of the host's /etc stays hidden."""
GENERATED_ETC = ("passwd", "group", "hosts", "nsswitch.conf")
"""/etc files written for each sandbox (`etc_files`) instead of the host's."""


class HostSide:
    """The host-side state of one isolated sandbox; `close()` undoes all of it (idempotent)."""

    def __init__(self, source_dir: str | Path, config: SandboxConfig, inner_root: str, group_limits: bool = True):
        """group_limits: make the sandbox's cgroup (a backend whose runtime makes its own, per
        command, passes False)."""
        self._lease: _UidLease | None = None
        self.scratch: Scratch | None = None
        self.cgroup: SandboxCgroup | None = None
        try:
            self._lease = _UidLease() if os.geteuid() == 0 else None
            self.uid = self._lease.uid if self._lease else os.getuid()
            self.gid = self._lease.uid if self._lease else os.getgid()
            prefix = scratch_prefix(config.backend)
            self.scratch = Scratch(prefix, config.scratch_dir, config.disk_mb, on_stale=cgroup.remove_stale)
            root = self.scratch.path
            copy_tree(Path(source_dir), root / "workspace")
            (root / "tmp").mkdir(mode=0o700)
            (root / "shm").mkdir(mode=0o700)  # its /dev/shm (POSIX semaphores: multiprocessing)
            (root / "etc").mkdir(mode=0o755)
            for name, text in etc_files(self.uid, self.gid).items():
                (root / "etc" / name).write_text(text)
                os.chmod(root / "etc" / name, 0o644)
            if self._lease:
                chown_tree(root / "workspace", self.uid, self.gid)
                os.chown(root / "tmp", self.uid, self.gid)
                os.chown(root / "shm", self.uid, self.gid)
            if group_limits:
                self.cgroup = SandboxCgroup.create(
                    self.scratch.name, memory_mb=config.memory_mb, max_procs=config.max_procs, cpus=config.cpus
                )
        except BaseException:
            self.close()
            raise
        owner = (self.uid, self.gid) if self._lease else None
        self.workspace = Workspace(
            root / "workspace", owner=owner, inner_root=inner_root, max_file_bytes=config.max_file_bytes
        )
        self.tmp = root / "tmp"
        self.shm = root / "shm"
        self.etc = root / "etc"

    def close(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def sweep_leftovers(config: SandboxConfig) -> None:
    """Remove what sandboxes of a killed process left: scratch copies, quota mounts, cgroups, uid
    lock files. Every process does this on its first sandbox; a restarted server calls it at
    start, so that it cleans up before anyone opens one."""
    sweep_once(scratch_prefix(config.backend), Path(config.scratch_dir or tempfile.gettempdir()), cgroup.remove_stale)
    if os.geteuid() == 0:
        _UidLease.sweep()


def sandbox_env(config: SandboxConfig, workdir: str) -> dict[str, str]:
    """The environment every command of an isolated sandbox starts from (config.env and the
    call's env are added on top): the sandbox user, /tmp as home, the workspace on PYTHONPATH
    and python_env's bin/ first on PATH."""
    path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
    env = {
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": USER,
        "LOGNAME": USER,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONPATH": workdir,
    }
    if config.python_env:
        venv = os.path.abspath(config.python_env)
        path = f"{venv}/bin:{path}"
        env["VIRTUAL_ENV"] = venv
    env["PATH"] = path
    return env


def etc_files(uid: int, gid: int) -> dict[str, str]:
    """The sandbox's own /etc/passwd, group, hosts and nsswitch.conf: its user resolves by name
    (`getpass.getuser()`, `pwd.getpwuid(os.getuid())`), `localhost` and its hostname resolve, and
    lookups never reach the host's name services."""
    return {
        "passwd": f"root:x:0:0:root:/root:/bin/sh\n{USER}:x:{uid}:{gid}:{USER}:/tmp:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\n{USER}:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
        "networks: files\nprotocols: files\nservices: files\n",
    }


def read_only_paths(config: SandboxConfig) -> list[str]:
    """Host paths shown read-only at the same path: ro_binds, python_env and its base Python."""
    paths = []
    for p in config.ro_binds:
        if not os.path.exists(p):
            raise SandboxError(f"sandbox.ro_binds: {p!r} does not exist")
        paths.append(os.path.abspath(p))
    if config.python_env:
        paths += python_env_paths(config.python_env)
    return paths


def python_env_paths(venv: str | Path) -> list[str]:
    """The venv and the prefix of the interpreter its bin/python links to (when outside /usr)."""
    venv = Path(venv).absolute()
    python = venv / "bin" / "python"
    if not python.exists():
        raise SandboxError(
            f"sandbox.python_env: {str(venv)!r} has no bin/python; expected a virtual environment"
        )
    paths = [str(venv)]
    base_prefix = Path(os.path.realpath(python)).parent.parent
    if not under(str(base_prefix), ["/usr"]) and not under(str(base_prefix), [str(venv)]):
        paths.append(str(base_prefix))
    return paths


def under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class _UidLease:
    """A host uid of our own for one sandbox, held by an flock on a lock file (root only).

    The lock file is deleted on release (while still locked), so the directory holds one file per
    open sandbox; a lock taken on a file that was deleted meanwhile is detected and retried. Files
    left by a killed process are unlocked: the first lease of a process deletes them.
    """

    LOCK_DIR = Path(tempfile.gettempdir()) / "carl-sandbox-uids"
    _swept = False

    def __init__(self) -> None:
        self.LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        st = self.LOCK_DIR.lstat()
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o077:
            raise SandboxError(f"{self.LOCK_DIR} must be a directory owned by root with mode 0700")
        if not _UidLease._swept:
            self.sweep()
        for _ in range(64):
            uid = UID_BASE + random.randrange(UID_COUNT)
            path = self.LOCK_DIR / str(uid)
            fd = self._lock(path, create=True)
            if fd is not None:
                self.uid, self._fd, self._path = uid, fd, path
                return
        raise SandboxError("could not lease a sandbox uid (64 tries); too many open sandboxes?")

    @classmethod
    def sweep(cls) -> None:
        """Delete the lock files no process holds (their sandbox's owner was killed)."""
        cls._swept = True
        cls.LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        for path in cls.LOCK_DIR.iterdir():
            fd = cls._lock(path, create=False)
            if fd is not None:
                path.unlink(missing_ok=True)
                os.close(fd)

    @staticmethod
    def _lock(path: Path, create: bool) -> int | None:
        """An fd holding the lock on path, or None when another process holds it (or it vanished)."""
        try:
            fd = os.open(path, (os.O_CREAT if create else 0) | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                raise FileNotFoundError  # its holder deleted it between our open and flock
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            return None
        return fd

    def release(self) -> None:
        if self._fd >= 0:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = -1
