"""The bwrap backend (the default): each command runs in fresh Linux namespaces via bubblewrap.

What a command inside sees and may do:
- the workspace (a private copy of the repository) read-write at /workspace, its cwd;
- a private, persistent /tmp (a host directory of this sandbox, deleted on close);
- /usr (with /bin, /lib* as on the host), python_env and ro_binds, all read-only; an /etc
  (mode 0755) of generated passwd, group, hosts and nsswitch.conf (the sandbox user has a name,
  `localhost` resolves) and a few read-only host files; nothing else of the host (no home, no
  /work, no /root, no /opt, ...);
- no network (its own network namespace with only loopback, which is up) unless
  config.network; its own PID, IPC and UTS namespaces; a new session (no TIOCSTI into ours);
- a seccomp filter (carl.sandbox.seccomp): no new namespaces, keyring, bpf, ptrace, perf
  events, io_uring, mounts or kernel modules;
- limits of the sandbox as a whole, where the host can make cgroups (carl.sandbox.cgroup):
  memory (memory_mb), processes (max_procs), CPU quota (cpus); per process rlimits as well
  (CPU seconds, address space, no core files, a process count of this sandbox's uid);
- a disk quota when the host runs as root: the copy and /tmp live on a tmpfs of disk_mb;
- a wall-clock limit: bwrap is the leader of its own process group, and killing that group
  kills bwrap's init (--die-with-parent), which tears down the whole PID namespace, children,
  grandchildren and setsid() escapees included. The namespace also dies when the command ends,
  so nothing runs between two execs (but calls of one message run concurrently: the host's
  file operations are race-proof on their own, see carl.sandbox.workspace).

Process limit. RLIMIT_NPROC counts processes per user, and root is exempt from it. So:
- host runs as root: bwrap runs privileged (no user namespace) and the command drops, via
  setpriv, to a uid of its own (leased from a range, one per open sandbox, held by a lock
  file) with no capabilities; the workspace belongs to that uid, and the host's own file
  operations on it run with that uid as their filesystem id.
- host runs as a normal user: bwrap makes a user namespace; since Linux 5.14 the count is per
  (user namespace, uid), so the limit set inside counts this sandbox only as well.

NOT guaranteed (see docs/sandbox.md): the kernel is the host's (a kernel bug reachable through
the allowed system calls is an escape; gvisor puts a user-space kernel in between); without a
writable cgroup hierarchy memory and processes are limited per process only, and without root
there is no disk quota; CPU time and timing side channels are shared with the host; the host's
/usr and the listed /etc files are readable.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from carl.sandbox.base import ExecResult, FileEntry, SandboxConfig, SandboxError
from carl.sandbox.host import ETC_FILES, GENERATED_ETC, HOSTNAME, HostSide, read_only_paths, sandbox_env, under
from carl.sandbox.process import kill_group, run_process
from carl.sandbox.seccomp import filter_program

WORKDIR = "/workspace"
"""Where the workspace appears inside the sandbox."""
STARTED_MARK = b"started"
"""Written to a pipe by the sandbox's last step before the command (no mark: the setup failed)."""
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level paths that are symlinks into /usr on merged-/usr systems, or directories otherwise."""
SECCOMP_PROGRAM = filter_program()
"""The seccomp filter every command runs under (None on architectures without a syscall table)."""


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
        self._ro_binds = read_only_paths(config)
        self._running: set[int] = set()
        self._closed = True  # until fully built; __del__ and close() skip a half-made sandbox
        self._host = HostSide(source_dir, config, inner_root=WORKDIR)
        self._ws = self._host.workspace
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
        inner_cwd = f"{WORKDIR}/{self._ws.directory(cwd)}".removesuffix("/.")
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        full_env = {**sandbox_env(self.config, WORKDIR), **self.config.env, **(env or {})}
        status_r, status_w = os.pipe()
        seccomp_fd = _pipe_with(SECCOMP_PROGRAM) if SECCOMP_PROGRAM else -1
        try:
            bwrap_argv = self._argv(argv, inner_cwd, full_env, started_fd=status_w, seccomp_fd=seccomp_fd)
            res = run_process(
                self._host.cgroup.wrap(bwrap_argv) if self._host.cgroup else bwrap_argv,
                timeout_s=timeout_s or self.config.timeout_s,
                max_output_bytes=self.config.max_output_bytes,
                stdin=stdin,
                running=self._running,
                pass_fds=(status_w,) if seccomp_fd < 0 else (status_w, seccomp_fd),
            )
            os.close(status_w)
            status_w = -1
            started = _read_all(status_r).startswith(STARTED_MARK)  # the command may write more
        finally:
            for fd in (status_r, status_w, seccomp_fd):
                if fd >= 0:
                    os.close(fd)
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
        self._host.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    # -- helpers -------------------------------------------------------------------------------

    def _argv(
        self, argv: list[str], inner_cwd: str, env: dict[str, str], started_fd: int, seccomp_fd: int
    ) -> list[str]:
        """The full bwrap command line for one exec: bwrap sh(mark started) [setpriv] prlimit argv."""
        cfg = self.config
        as_root = os.geteuid() == 0
        args = [self._bwrap, "--die-with-parent", "--new-session", "--hostname", HOSTNAME]
        args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not cfg.network:
            args.append("--unshare-net")
        if not as_root:
            args.append("--unshare-user")
        args += self._system_binds()
        args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self._host.shm), "/dev/shm"]
        args += ["--bind", str(self._host.tmp), "/tmp", "--bind", str(self._ws.root), WORKDIR]
        args += _ro_bind_args(self._ro_binds)
        args += ["--chdir", inner_cwd, "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        if seccomp_fd >= 0:
            args += ["--seccomp", str(seccomp_fd)]
        # The first process inside marks that bwrap's setup succeeded (dash has no `>&N` for N > 9).
        mark = f'printf {STARTED_MARK.decode()} >/proc/self/fd/{started_fd} && exec "$@"'
        if as_root:
            args += ["--cap-add", "CAP_SETUID,CAP_SETGID"]
        args += ["--", "/bin/sh", "-c", mark, "sh"]
        if as_root:
            uid, gid = str(self._host.uid), str(self._host.gid)
            args += ["setpriv", "--reuid", uid, "--regid", gid, "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        args += ["prlimit", f"--nproc={cfg.max_procs}", f"--as={cfg.memory_mb * 1024 * 1024}"]
        args += [f"--cpu={cfg.cpu_s}", "--core=0", "--", *argv]
        return args

    def _system_binds(self) -> list[str]:
        """/usr, the top-level links into it, and an /etc of generated and selected host files (0755:
        a directory bwrap makes for a bind's parent is 0700, which the sandbox user could not enter)."""
        args = ["--ro-bind", "/usr", "/usr"]
        for name in SYSTEM_LINKS:
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        args += ["--perms", "0755", "--dir", "/etc"]
        for name in GENERATED_ETC:
            args += ["--ro-bind", str(self._host.etc / name), f"/etc/{name}"]
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        return args

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


def _ro_bind_args(paths: list[str]) -> list[str]:
    """--ro-bind each path at the same place, first creating missing parent dirs as 0755.

    (bwrap would create them itself, but with mode 0700, which the sandbox uid cannot enter.)
    """
    args: list[str] = []
    made = {"/", "/tmp", "/usr", "/etc", WORKDIR}
    bound: list[str] = ["/usr"]
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if under(path, bound):
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


def _pipe_with(data: bytes) -> int:
    """The read end of a pipe holding data (a seccomp program is far below a pipe's capacity)."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r
