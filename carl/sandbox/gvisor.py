"""The gvisor backend: each command runs in a fresh gVisor container (runsc), a user-space kernel.

The agent's processes do not talk to the host kernel: their system calls are served by gVisor's
Sentry (a Go program, itself under a strict seccomp filter on the host), and files reach it
through a Gofer process. A kernel bug reachable from the sandbox is no longer an escape by
itself; a gVisor bug is.

What a command inside sees and may do (the same as bwrap's, carl.sandbox.bwrap):
- the workspace (a private copy) read-write at /workspace, its cwd; a private, persistent /tmp
  and /dev/shm (host directories of this sandbox, deleted on close). These are bind mounts
  without an overlay, so a write inside is in the host directory when exec returns (and the
  host's read_file / write_file act on the same files, see carl.sandbox.workspace);
- /usr (with /bin, /lib* as on the host), the generated /etc files and the listed host ones,
  python_env (with its base interpreter) and ro_binds, all read-only; gVisor's own /proc, /sys
  and /dev; nothing else of the host. The root is an empty directory holding the mount points;
- no network: only loopback (gVisor's netstack) unless config.network, which passes socket calls
  to the host's network stack (`--network=host`);
- a uid of its own when the host runs as root (the HostSide lease; the workspace belongs to it),
  no capabilities, no_new_privs (on the host the Sentry runs as `nobody`); bwrap's seccomp policy
  (no new namespaces, keyring, bpf, ptrace, mounts, ...: `SECCOMP` below) applied by gVisor;
- limits: RLIMIT_AS per process (an allocation past it fails: MemoryError), RLIMIT_NPROC, which
  gVisor counts in its own kernel, so over this container's processes only (a fork bomb stops
  there), no core files; and, where the host can make cgroups (carl.sandbox.cgroup), a memory
  limit and a CPU quota (config.cpus) for the container as a whole (Sentry, Gofer and the
  agent's processes): the Sentry reports memory_mb as MemTotal, and going past it gets the whole
  container OOM-killed by the host (exit code 137 whatever runsc returned, every process of the
  exec dies, and stderr ends with a line saying so, since no shell is left to print bash's
  "Killed");
- a wall-clock limit: killing `runsc run` kills its attached Sentry and Gofer, and `runsc delete
  --force` removes what is left. When the command ends the container ends, background children
  included, so nothing runs between two execs. `runsc run` dies with the host process too (a
  parent-death signal), so a host killed by SIGKILL leaves no container running.

Setup failures are told from the command's own exit codes as in bwrap: the container's first
process prints a mark on stdout before it execs the command (and the mark is cut off again), so
a command that prints `runsc: ...` and exits 1 is an ordinary result, never a SandboxError.

runsc flags (`_runsc_argv`): `--root` in the scratch directory (no state in /var/run; removed
on close), `--network=none`, `--overlay2=none` (writes go straight to the host directories, and
writes to the read-only root fail instead of landing in a memory overlay, which newer runsc
versions make by default), `--oci-seccomp` (apply the spec's seccomp filter inside). The
platform is runsc's default: ptrace in the 2022-12 release (Debian bookworm's `runsc`,
0.0~20221219), systrap in later ones; `--platform=kvm` hung on our nested (Firecracker) VM.
No `--ignore-cgroups`: the container joins the group made for it (per exec, below the host
process's own), and runsc makes the other controllers' groups. Not HostSide's group of the
sandbox: its pids limit would count the Sentry's host threads (see below).

Cost: each exec starts a container, which is what keeps "nothing runs between two execs". On
the 2-core development VM at load 5-5.5 (other jobs running), p50 of 30 runs of `true`, two runs:
create + exec + close 320-341 ms (bwrap 51-55 ms), exec alone 336-337 ms (bwrap 23-45 ms);
`runsc exec` into one long-lived container took 29-33 ms, but then the sandbox's processes would
outlive each command. Nearly all of it is runsc's own start (three Go processes, the Sentry's
boot): dropping 17 of the 28 mounts, the cgroup or the start mark each changed it by under 10%.
System calls cost more too (ptrace platform): `python -c "import pytest"` took 1145 ms against
454-508 ms under bwrap.

NOT guaranteed:
- gVisor is the boundary: a bug in the Sentry, the Gofer (root on the host with few capabilities,
  in a mount namespace of its own, serving the bound paths) or runsc is an escape.
- RLIMIT_CPU (cpu_s) is set but NOT enforced by runsc 2022-12: a busy loop runs until the
  wall-clock limit; only the timeout and the CPU quota bound it.
- No host pids limit: the Sentry's Go runtime needs host threads (with ptrace, several per agent
  process), and a pids limit on them crashes it ("fatal error: newosproc", exit code 2, no
  output), so the process count is RLIMIT_NPROC inside gVisor only.
- Memory is limited per exec (each container has its group), not per sandbox: two execs run
  concurrently can each use memory_mb. Without a writable cgroup hierarchy: RLIMIT_AS only.
- runsc 2022-12 rejects the AT_NO_AUTOMOUNT flag of statx(2) with EINVAL, which coreutils 9
  passes: `ls` and `stat` fail ("cannot access ...: Invalid argument"); find, Python, git and
  most other tools (fstatat) work. Newer runsc releases run them (gVisor issue 11049, 2024,
  shows `ls -l` working in a debian:bookworm container).
- Disk is limited as HostSide does (a tmpfs quota of disk_mb when the host runs as root).
- The host's /usr and the listed /etc files are readable; so are python_env and ro_binds.
- A host process killed by SIGKILL leaves the container's (empty) cgroup directories behind, as
  well as its scratch directory (swept by the next sandbox, see carl.sandbox.scratch).
- Tested with the host running as root only (runsc without root needs `--rootless`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Self

from carl.sandbox import cgroup, seccomp
from carl.sandbox.base import ExecResult, FileEntry, SandboxConfig, SandboxError
from carl.sandbox.bwrap import STARTED_MARK, SYSTEM_LINKS, WORKDIR
from carl.sandbox.cgroup import SandboxCgroup
from carl.sandbox.host import ETC_FILES, GENERATED_ETC, HOSTNAME, HostSide, read_only_paths, sandbox_env, under
from carl.sandbox.process import OOM_EXIT_CODE, kill_group, run_process

_NO_PIDS_LIMIT = 1 << 22
"""The kernel's largest pid_max: no host pids limit (the Sentry's host threads are not the agent's
processes, and a limit on them crashes it; RLIMIT_NPROC inside gVisor counts those)."""
SECCOMP = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {"names": list(seccomp.DENIED), "action": "SCMP_ACT_ERRNO"},
        {  # clone with any CLONE_NEW* flag (several rules on one argument: any one matches)
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "args": [
                {"index": 0, "value": bit, "valueTwo": bit, "op": "SCMP_CMP_MASKED_EQ"}
                for bit in (1 << i for i in range(32))
                if seccomp.CLONE_NEW_FLAGS & bit
            ],
        },
    ],
}
"""bwrap's seccomp policy (carl.sandbox.seccomp) as an OCI filter, which gVisor applies to the
agent's processes inside (`--oci-seccomp`). Denied calls fail with EPERM (runsc 2022-12 ignores
errnoRet). clone3 needs no rule here: runsc 2022-12 answers ENOSYS itself and the C library falls
back to clone (a runsc that implements clone3 would need one, and EPERM would break that
fallback). Inside gVisor these calls reach the Sentry, not the host kernel: the filter narrows
gVisor's own attack surface (its user namespaces, ptrace, keyring)."""
_RW = ["rbind", "rw", "nosuid", "nodev"]
_RO = ["rbind", "ro", "nosuid", "nodev"]


def gvisor_available() -> bool:
    return shutil.which("runsc") is not None


class GvisorSandbox:
    """A private copy of source_dir; every exec runs in a fresh gVisor container."""

    workdir = WORKDIR

    def __init__(self, source_dir: str | Path, config: SandboxConfig | None = None):
        self.config = config = config or SandboxConfig()
        self._runsc = shutil.which("runsc")
        if not self._runsc:
            raise SandboxError("gVisor (runsc) is not installed: apt-get install runsc")
        self._ro_binds = read_only_paths(config)
        self._running: dict[str, set[int]] = {}  # container id -> the process group of its `runsc run`
        self._closed = True  # until fully built; __del__ and close() skip a half-made sandbox
        # No sandbox-wide group: each exec's container gets its own below (runsc joins it).
        self._host = HostSide(source_dir, config, inner_root=WORKDIR, group_limits=False)
        self._ws = self._host.workspace
        try:
            root = self._host.scratch.path
            self._rootfs, self._state = root / "rootfs", root / "runsc"
            self._mounts = self._make_rootfs()
            self._state.mkdir(mode=0o700)
        except BaseException:
            self._host.close()
            raise
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
        cfg = self.config
        inner_cwd = f"{WORKDIR}/{self._ws.directory(cwd)}".removesuffix("/.")
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        full_env = {**sandbox_env(cfg, WORKDIR), **cfg.env, **(env or {})}
        cid = f"{self._host.scratch.name}-{uuid.uuid4().hex[:8]}"
        # The container's memory, CPU (and pids: none) group is made here, not by runsc: runsc joins a
        # group that exists and leaves it in place, so an OOM kill can be read after the container.
        group = (
            SandboxCgroup.create(cid, memory_mb=cfg.memory_mb, max_procs=_NO_PIDS_LIMIT, cpus=cfg.cpus)
            if cgroup.available()
            else None
        )
        bundle = self._state / f"{cid}.bundle"
        self._running[cid] = pgids = set()
        res = None
        try:
            bundle.mkdir(mode=0o700)
            spec = self._spec(argv, inner_cwd, full_env, cgroups_path=cid if group else None)
            (bundle / "config.json").write_text(json.dumps(spec))
            res = run_process(
                # pdeathsig: if the host process dies, `runsc run` dies, and the container with it.
                ["setpriv", "--pdeathsig=KILL", "--", *self._runsc_argv(), "run", f"--bundle={bundle}", cid],
                timeout_s=timeout_s or cfg.timeout_s,
                max_output_bytes=cfg.max_output_bytes + len(STARTED_MARK),
                stdin=stdin,
                running=pgids,
            )
        finally:
            started = res is not None and res.stdout.startswith(STARTED_MARK.decode())
            if res is None or res.timed_out or self._closed or not started:
                # `runsc run` was killed, or failed, before it tore the container down (on a failed
                # start it leaves the container's state and cgroups behind): delete does that.
                self._destroy(cid)
            self._running.pop(cid, None)
            shutil.rmtree(bundle, ignore_errors=True)
            oom_killed = group is not None and group.oom_kills() > 0
            if group is not None:
                group.remove()
        if not started:
            if res.timed_out:
                return res
            # The mark is printed by the container's first process before the command runs, so a
            # command cannot fake an infrastructure failure (which would mask its own reward).
            raise SandboxError(f"runsc could not start the container: {res.stderr.strip()[-2000:]}")
        return container_result(res, oom_killed=oom_killed, memory_mb=cfg.memory_mb)

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
        for cid, pgids in list(self._running.items()):
            for pgid in list(pgids):
                kill_group(pgid)
            self._destroy(cid)
        self._host.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    # -- helpers -------------------------------------------------------------------------------

    def _runsc_argv(self) -> list[str]:
        """runsc and its global flags (why each: the module docstring)."""
        network = "host" if self.config.network else "none"
        return [
            self._runsc,
            f"--root={self._state}",
            f"--network={network}",
            "--overlay2=none",
            "--oci-seccomp",
        ]

    def _spec(self, argv: list[str], inner_cwd: str, env: dict[str, str], cgroups_path: str | None) -> dict:
        """The OCI runtime spec (config.json) of one exec's container."""
        cfg = self.config
        rlimits = {"RLIMIT_CPU": cfg.cpu_s, "RLIMIT_AS": cfg.memory_mb << 20, "RLIMIT_NPROC": cfg.max_procs,
                   "RLIMIT_CORE": 0}  # fmt: skip
        mark = f'printf {STARTED_MARK.decode()} && exec "$@"'
        linux: dict = {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "seccomp": SECCOMP,
        }
        if cfg.network:
            linux["namespaces"].pop()
        if cgroups_path:
            # Relative: below the host process's own group, where SandboxCgroup made it (with its
            # limits; the Sentry reads the memory limit as its MemTotal).
            linux["cgroupsPath"] = cgroups_path
        return {
            "ociVersion": "1.0.0",
            "process": {
                "terminal": False,
                "user": {"uid": self._host.uid, "gid": self._host.gid},
                "args": ["/bin/sh", "-c", mark, "sh", *argv],
                "env": [f"{k}={v}" for k, v in env.items()],
                "cwd": inner_cwd,
                "capabilities": {
                    k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
                },
                "rlimits": [{"type": k, "hard": v, "soft": v} for k, v in rlimits.items()],
                "noNewPrivileges": True,
            },
            "root": {"path": str(self._rootfs), "readonly": True},
            "hostname": HOSTNAME,
            "mounts": self._mounts,
            "linux": linux,
        }

    def _make_rootfs(self) -> list[dict]:
        """An empty root directory holding the mount points, and the OCI mounts onto it."""
        self._rootfs.mkdir(mode=0o755)
        mounts = [{"destination": "/proc", "type": "proc", "source": "proc"}]

        def bind(source: str | Path, dest: str, options: list[str]) -> None:
            target = self._rootfs / dest.lstrip("/")
            for parent in reversed(target.relative_to(self._rootfs).parents):
                (self._rootfs / parent).mkdir(mode=0o755, exist_ok=True)  # 0755: the uid must pass
            if os.path.isdir(source):
                target.mkdir(mode=0o755, exist_ok=True)
            else:
                target.touch(mode=0o644, exist_ok=True)
            mounts.append({"destination": dest, "type": "bind", "source": str(source), "options": options})

        bind("/usr", "/usr", _RO)
        for name in SYSTEM_LINKS:
            host = Path("/") / name
            if host.is_symlink():
                (self._rootfs / name).symlink_to(os.readlink(host))
            elif host.is_dir():
                bind(host, str(host), _RO)
        for name in GENERATED_ETC:
            bind(self._host.etc / name, f"/etc/{name}", _RO)
        for name in ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                bind(f"/etc/{name}", f"/etc/{name}", _RO)
        bind(self._host.tmp, "/tmp", _RW)
        bind(self._host.shm, "/dev/shm", _RW)
        bind(self._ws.root, WORKDIR, _RW)
        bound = ["/usr"]
        for path in sorted(set(self._ro_binds), key=lambda p: (p.count("/"), p)):
            if not under(path, bound):
                bind(path, path, _RO)
                bound.append(path)
        return mounts

    def _destroy(self, cid: str) -> None:
        """Kill a container that may still run, remove its state and cgroups (quiet when gone)."""
        subprocess.run([*self._runsc_argv(), "delete", "--force", cid], check=False, capture_output=True)
        # runsc leaves its groups behind when it fails (or is killed) before its state is saved.
        cgroup.remove_stale(cid)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")


def container_result(res: ExecResult, *, oom_killed: bool, memory_mb: int) -> ExecResult:
    """What an exec returns, from what `runsc run` returned (its stdout starts with the mark).

    On an OOM kill of the container's group the host kills one of its processes (a ptrace stub
    holding guest memory, by dmesg) and runsc ends the container, mostly with exit code 137; under
    load CI saw 2 instead (a Go runtime's fatal error: the Sentry's, under the same memory
    pressure). Either way the command was killed for memory, and it says so as bash does.
    """
    stderr, exit_code = res.stderr, res.exit_code
    if oom_killed and not res.timed_out:  # no shell is left to print "Killed", as bash does under bwrap
        stderr += f"Killed: the command's processes together went over memory_mb ({memory_mb} MiB)\n"
        if exit_code != 0:  # a command that still exited 0 keeps its 0
            exit_code = OOM_EXIT_CODE
    return replace(res, exit_code=exit_code, stdout=res.stdout[len(STARTED_MARK) :], stderr=stderr)
