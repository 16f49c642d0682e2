"""The bwrap backend (the default): each command runs in fresh Linux namespaces via bubblewrap.

What a command inside sees and may do:
- the workspace (a private copy of the repository) read-write at /workspace, its cwd;
- a private, persistent /tmp (a host directory of this sandbox, deleted on close);
- /usr (with /bin, /lib* as on the host), a few files of /etc, python_env and ro_binds,
  all read-only; nothing else of the host (no home, no /work, no /root, no /opt, ...);
- no network (its own network namespace with only loopback, which is up) unless
  config.network; its own PID, IPC and UTS namespaces; a new session (no TIOCSTI into ours);
- rlimits per process: CPU seconds, address space, no core files; and a process limit that
  counts only this sandbox's processes (see below);
- a wall-clock limit: bwrap is the leader of its own process group, and killing that group
  kills bwrap's init (--die-with-parent), which tears down the whole PID namespace, children,
  grandchildren and setsid() escapees included. The namespace also dies when the command ends,
  so nothing runs between two execs.

Process limit. RLIMIT_NPROC counts processes per user, and root is exempt from it. So:
- host runs as root: bwrap runs privileged (no user namespace) and the command drops, via
  setpriv, to a uid of its own (leased from a range, one per open sandbox, held by a lock
  file) with no capabilities; the workspace belongs to that uid. The limit then counts this
  sandbox's processes only, and a fork bomb cannot touch the host's or other sandboxes'.
- host runs as a normal user: bwrap makes a user namespace; since Linux 5.14 the count is per
  (user namespace, uid), so the limit set inside counts this sandbox only as well.

NOT guaranteed (see docs/sandbox.md): the kernel is the host's (a kernel bug is an escape);
no seccomp filter; memory is limited per process (RLIMIT_AS), not per sandbox, and disk use
in /workspace and /tmp is not limited; CPU time and timing side channels are shared with the
host; the host's /usr and selected /etc files (user names, hostname file) are readable.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from carl.sandbox.base import ExecResult, FileEntry, SandboxConfig, SandboxError, SandboxPathError
from carl.sandbox.process import kill_group, run_process
from carl.sandbox.workspace import Workspace, chown_tree, copy_tree, make_scratch_dir, remove_tree

WORKDIR = "/workspace"
"""Where the workspace appears inside the sandbox."""
STARTED_MARK = b"started"
"""Written to a pipe by the sandbox's last step before the command (no mark: the setup failed)."""
UID_BASE, UID_COUNT = 2_000_000, 1_000_000
"""Range of host uids leased to sandboxes when the host runs as root (far from real users)."""
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level paths that are symlinks into /usr on merged-/usr systems, or directories otherwise."""
ETC_FILES = (
    "passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "alternatives", "localtime", "os-release", "mime.types", "protocols", "services", "ssl",
    "ca-certificates", "gai.conf", "host.conf", "bash.bashrc", "inputrc", "magic", "magic.mime",
)  # fmt: skip
"""The /etc entries bound read-only (when they exist); the rest of /etc stays hidden."""


def bwrap_available() -> bool:
    return shutil.which("bwrap") is not None


class BwrapSandbox:
    """A private copy of source_dir; every exec runs in fresh bubblewrap namespaces."""

    workdir = WORKDIR

    def __init__(self, source_dir: str | Path, config: SandboxConfig | None = None):
        self.config = config = config or SandboxConfig()
        self._bwrap = shutil.which("bwrap")
        if not self._bwrap:
            raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        self._ro_binds = _extra_ro_binds(config)
        self._running: set[int] = set()
        self._closed = True  # until fully built; __del__ and close() skip a half-made sandbox
        self._uid_lease: _UidLease | None = None
        self._tmp: Path | None = None
        try:
            self._uid_lease = _UidLease() if os.geteuid() == 0 else None
            self._tmp = make_scratch_dir("carl-bwrap-", config.scratch_dir)
            copy_tree(Path(source_dir), self._tmp / "workspace")
            (self._tmp / "tmp").mkdir()
            if self._uid_lease:
                chown_tree(self._tmp, self._uid_lease.uid, self._uid_lease.uid)
        except BaseException:
            self._release()
            raise
        owner = (self._uid_lease.uid, self._uid_lease.uid) if self._uid_lease else None
        self._ws = Workspace(self._tmp / "workspace", owner=owner)
        self._closed = False

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        self._check_open()
        host_cwd = self._ws.resolve(cwd)
        if not host_cwd.is_dir():
            raise SandboxPathError(f"cwd {cwd!r} is not a directory")
        inner_cwd = f"{WORKDIR}/{self._ws.relative(host_cwd)}".removesuffix("/.")
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        full_env = {**self._base_env(), **self.config.env, **(env or {})}
        status_r, status_w = os.pipe()
        try:
            res = run_process(
                self._argv(argv, inner_cwd, full_env, started_fd=status_w),
                timeout_s=timeout_s or self.config.timeout_s,
                max_output_bytes=self.config.max_output_bytes,
                stdin=stdin,
                running=self._running,
                pass_fds=(status_w,),
            )
            os.close(status_w)
            status_w = -1
            started = _read_all(status_r).startswith(STARTED_MARK)  # the command may write more
        finally:
            os.close(status_r)
            if status_w >= 0:
                os.close(status_w)
        if not started and not res.timed_out:
            # The mark is written once bwrap's setup succeeded, before the command runs, so a command
            # cannot fake an infrastructure failure (which would mask its own reward).
            raise SandboxError(f"bwrap could not start the sandbox: {res.stderr.strip()[-2000:]}")
        return res

    def read_file(self, path: str) -> bytes:
        self._check_open()
        return self._ws.read_file(path)

    def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        self._ws.write_file(path, data)

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        self._check_open()
        return self._ws.list_files(path, recursive)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pgid in list(self._running):
            kill_group(pgid)
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    # -- helpers -------------------------------------------------------------------------------

    def _argv(self, argv: list[str], inner_cwd: str, env: dict[str, str], started_fd: int) -> list[str]:
        """The full bwrap command line for one exec: bwrap sh(mark started) [setpriv] prlimit argv."""
        cfg = self.config
        args = [self._bwrap, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not cfg.network:
            args.append("--unshare-net")
        if self._uid_lease is None:
            args.append("--unshare-user")
        args += _system_binds()
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--bind", str(self._tmp / "tmp"), "/tmp", "--bind", str(self._ws.root), WORKDIR]
        args += _ro_bind_args(self._ro_binds)
        args += ["--chdir", inner_cwd, "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        # The first process inside marks that bwrap's setup succeeded (dash has no `>&N` for N > 9).
        mark = f'printf {STARTED_MARK.decode()} >/proc/self/fd/{started_fd} && exec "$@"'
        if self._uid_lease:
            args += ["--cap-add", "CAP_SETUID,CAP_SETGID"]
        args += ["--", "/bin/sh", "-c", mark, "sh"]
        if self._uid_lease:
            uid = str(self._uid_lease.uid)
            args += ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        args += ["prlimit", f"--nproc={cfg.max_procs}", f"--as={cfg.memory_mb * 1024 * 1024}"]
        args += [f"--cpu={cfg.cpu_s}", "--core=0", "--", *argv]
        return args

    def _base_env(self) -> dict[str, str]:
        path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
        env = {
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONPATH": WORKDIR,
        }
        if self.config.python_env:
            venv = os.path.abspath(self.config.python_env)
            path = f"{venv}/bin:{path}"
            env["VIRTUAL_ENV"] = venv
        env["PATH"] = path
        return env

    def _release(self) -> None:
        if self._tmp is not None:
            remove_tree(self._tmp)
        if self._uid_lease:
            self._uid_lease.release()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")


def _read_all(fd: int) -> bytes:
    """What is in a pipe now (non-blocking: a killed sandbox may not have closed its end yet)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    return b"".join(chunks)


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _extra_ro_binds(config: SandboxConfig) -> list[str]:
    """Host paths to bind read-only at the same path: ro_binds, python_env and its base Python."""
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
    if not _under(str(base_prefix), ["/usr"]) and not _under(str(base_prefix), [str(venv)]):
        paths.append(str(base_prefix))
    return paths


def _ro_bind_args(paths: list[str]) -> list[str]:
    """--ro-bind each path at the same place, first creating missing parent dirs as 0755.

    (bwrap would create them itself, but with mode 0700, which the sandbox uid cannot enter.)
    """
    args: list[str] = []
    made = {"/", "/tmp", "/usr", "/etc", WORKDIR}
    bound: list[str] = ["/usr"]
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if _under(path, bound):
            continue
        parents = []
        parent = os.path.dirname(path)
        while parent not in made:
            parents.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(parents):
            args += ["--dir", d]
            made.add(d)
        args += ["--ro-bind", path, path]
        bound.append(path)
        made.add(path)
    return args


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class _UidLease:
    """A host uid of our own for one sandbox, held by an flock on a lock file (root only).

    The lock file is deleted on release (while still locked), so the directory holds one file per
    open sandbox; a lock taken on a file that was deleted meanwhile is detected and retried.
    """

    LOCK_DIR = Path(tempfile.gettempdir()) / "carl-sandbox-uids"

    def __init__(self) -> None:
        self.LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        st = self.LOCK_DIR.lstat()
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o077:
            raise SandboxError(f"{self.LOCK_DIR} must be a directory owned by root with mode 0700")
        for _ in range(64):
            uid = UID_BASE + random.randrange(UID_COUNT)
            path = self.LOCK_DIR / str(uid)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    raise FileNotFoundError  # its holder deleted it between our open and flock
            except (BlockingIOError, FileNotFoundError):
                os.close(fd)
                continue
            self.uid, self._fd, self._path = uid, fd, path
            return
        raise SandboxError("could not lease a sandbox uid (64 tries); too many open sandboxes?")

    def release(self) -> None:
        if self._fd >= 0:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = -1
