"""Per-sandbox resource limits on a group of processes: a cgroup for each sandbox.

rlimits count per process: N processes of one sandbox could use N times RLIMIT_AS. A cgroup
limits the sandbox as a whole: memory (every process's resident memory plus what it wrote to
tmpfs, summed), the number of processes, and CPU time per period (a quota of `cpus` cores).

    <the host process's own cgroup>/<sandbox name>/      (cgroup v2), or in each of the memory,
    pids and cpu hierarchies of cgroup v1 the same path below the host's own group

Groups are made below the host process's own cgroup, so sandboxes never escape the limits the
host itself runs under. Each is a sibling of the host's processes, not a child of a shared
"all sandboxes" group: the CPU scheduler weighs a group like one process, so a shared parent
would give every sandbox together the CPU share of a single host process (measured: CPU-bound
tests ran about 2x slower beside other sandboxed work on a busy 2-core machine), while
siblings keep each sandbox's share as before and the quota (`cpus`) caps each one. A command enters its sandbox's group before it execs anything: the argv
is wrapped in `sh -c 'echo $$ > .../cgroup.procs; exec "$@"'` (a few hundred microseconds).

Availability: making groups needs a writable cgroup hierarchy (a root host, or a delegated
subtree). Where there is none, `SandboxCgroup.create` returns None once with a warning, and
the sandbox is limited per process only (its rlimits). On cgroup v2 the host's own group must
allow its controllers in subtree_control, which a group holding processes cannot (the "no
internal processes" rule) unless it is the root: then group limits are not available either.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class _Hierarchy:
    """Where carl's groups go: v2 (one directory) or v1 (one directory per controller)."""

    version: int
    bases: tuple[Path, ...]
    """The host's own group: for v2 one directory; for v1 one per controller, in V1_CONTROLLERS order."""


class SandboxCgroup:
    """The cgroup(s) of one sandbox: limits set at creation, every exec's process put inside."""

    def __init__(self, hierarchy: _Hierarchy, name: str):
        self.hierarchy = hierarchy
        self.paths = tuple(base / name for base in hierarchy.bases)

    @classmethod
    def create(cls, name: str, *, memory_mb: int, max_procs: int, cpus: float) -> SandboxCgroup | None:
        """A new group named `name` with these limits, or None where cgroups are not writable."""
        hierarchy = _hierarchy()
        if hierarchy is None:
            return None
        group = cls(hierarchy, name)
        try:
            for path in group.paths:
                path.mkdir()
            group._limit(memory_mb, max_procs, cpus)
        except OSError as e:
            group.remove()
            _warn(f"could not make the sandbox's cgroup {name} ({e.strerror or e})")
            return None
        return group

    def wrap(self, argv: list[str]) -> list[str]:
        """argv, run after its process joined this group."""
        procs = [str(p / "cgroup.procs") for p in self.paths]
        script = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ >"$f" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *procs, "--", *argv]

    def kill(self) -> None:
        """SIGKILL every process in the group."""
        for _ in range(10):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def pids(self) -> list[int]:
        out: set[int] = set()
        for path in self.paths:
            try:
                out.update(int(x) for x in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(out)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the group's memory limit."""
        path = self.paths[0] / ("memory.events" if self.hierarchy.version == 2 else "memory.oom_control")
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def remove(self) -> None:
        """Kill what is left and delete the group (empty groups only can be deleted: retried briefly)."""
        self.kill()
        for path in self.paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY: a killed process has not left yet
                    time.sleep(0.01)

    def _limit(self, memory_mb: int, max_procs: int, cpus: float) -> None:
        quota_us = int(cpus * CPU_PERIOD_US)
        if self.hierarchy.version == 2:
            (path,) = self.paths
            (path / "memory.max").write_text(str(memory_mb << 20))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            (path / "pids.max").write_text(str(max_procs))
            (path / "cpu.max").write_text(f"{quota_us} {CPU_PERIOD_US}")
            return
        memory, pids, cpu = self.paths
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
        (pids / "pids.max").write_text(str(max_procs))
        (cpu / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(quota_us))


def remove_stale(name: str) -> None:
    """Remove the groups of a sandbox whose owner died (called by the scratch-directory sweep):
    `name` itself and `name-*` (a runtime's per-command groups), in every controller's hierarchy
    below the host's own group, processes killed first."""
    if _hierarchy() is None:
        return
    own = own_groups()
    mounts = [CGROUP_ROOT] if (CGROUP_ROOT / "cgroup.controllers").exists() else sorted(
        {CGROUP_ROOT / c for c in own if c and (CGROUP_ROOT / c).is_dir()})  # fmt: skip
    for mount in mounts:
        controller = "" if mount == CGROUP_ROOT else mount.name
        base = mount / own.get(controller, "/").lstrip("/")
        for path in [base / name, *base.glob(f"{name}-*")]:
            if path.is_dir():
                SandboxCgroup(_Hierarchy(0, (base,)), path.name).remove()


@functools.cache
def _hierarchy() -> _Hierarchy | None:
    """Where this process can make sandbox groups, or None (with a warning) if nowhere."""
    own = own_groups()
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # the unified (v2) hierarchy is the only one
        base = CGROUP_ROOT / own.get("", "/").lstrip("/")
        wanted = {"memory", "pids", "cpu"}
        try:
            available = set((base / "cgroup.controllers").read_text().split())
            if not wanted <= available:
                raise OSError(f"controllers {sorted(wanted - available)} are not available")
            # Only a group without processes (or the root) may give its children controllers.
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
        except OSError as e:
            _warn(f"cgroup v2 group {base} cannot hold sandbox groups ({e})")
            return None
        return _Hierarchy(2, (base,))
    bases = []
    for controller in V1_CONTROLLERS:
        mount = CGROUP_ROOT / controller
        base = mount / own.get(controller, "/").lstrip("/")
        if not mount.is_dir() or not os.access(base, os.W_OK):
            _warn(f"no writable cgroup v1 '{controller}' hierarchy at {base}")
            return None
        bases.append(base)
    return _Hierarchy(1, tuple(bases))


def own_groups() -> dict[str, str]:
    """This process's cgroup per controller ("" for v2), from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c.removeprefix("name=")] = path
    return out


def _warn(message: str) -> None:
    warnings.warn(f"carl sandbox: {message}; sandboxes are limited per process only", stacklevel=3)


def available() -> bool:
    """Whether sandboxes get group limits on this host."""
    return _hierarchy() is not None
