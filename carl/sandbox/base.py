"""The Sandbox protocol: an isolated, private copy of a repository to act in.

A sandbox is created from a source directory, which it copies; nothing done inside is ever
visible in the source or in another sandbox. Commands run with the workspace as the working
directory. Paths given to read/write/list are relative to the workspace (absolute paths and
`..` that leave it are rejected with SandboxPathError).

Backends (`BACKENDS` below, opened by carl.sandbox.open_sandbox): "bwrap" (bubblewrap
namespaces, the default), "gvisor" (gVisor's runsc), "local" (a temp-dir copy, no isolation,
development only), "remote" (an HTTP environment server). What each backend does not
guarantee: docs/sandbox.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


BACKENDS: dict[str, str] = {
    "bwrap": "carl.sandbox.bwrap:BwrapSandbox",
    "gvisor": "carl.sandbox.gvisor:GvisorSandbox",
    "local": "carl.sandbox.local:LocalSandbox",
    "remote": "carl.sandbox.client:RemoteSandbox",
}
"""Every sandbox backend: name -> "module:class". The one list CLIs and configs take choices from."""
HOST_BACKENDS: tuple[str, ...] = tuple(b for b in BACKENDS if b != "remote")
"""Backends that run sandboxes on this machine (what an environment server can host)."""


@dataclass(frozen=True)
class SandboxConfig:
    backend: str = "bwrap"
    """One of BACKENDS: "bwrap", "gvisor", "local", "remote" (see carl.sandbox.open_sandbox)."""
    timeout_s: float = 60.0
    """Default wall-clock limit of one exec; the whole process group is killed when it passes."""
    memory_mb: int = 4096
    """Memory limit in MiB: of the sandbox's processes together (a cgroup, where the host can make
    one: bwrap, gvisor) and of each process's address space (RLIMIT_AS, every backend)."""
    cpu_s: int = 600
    """CPU-time limit per process (RLIMIT_CPU), in seconds."""
    cpus: float = 2.0
    """CPU cores the sandbox's processes may use together (a cgroup CPU quota, where available)."""
    max_procs: int = 256
    """Process limit: of the sandbox as a whole (cgroup pids limit, where available) and RLIMIT_NPROC
    (bwrap: counts only this sandbox's processes; local: not applied)."""
    disk_mb: int = 2048
    """Size limit in MiB of what the sandbox can write (workspace and /tmp together): the copy lives
    on a tmpfs of this size when the host runs as root (bwrap, gvisor); not enforced otherwise."""
    max_file_bytes: int = 32 << 20
    """read_file refuses files larger than this (checked before reading)."""
    max_output_bytes: int = 1_000_000
    """stdout and stderr of one exec are each cut to this many bytes (a truncation marker is added)."""
    network: bool = False
    """Allow network access (bwrap: share the host's network namespace). Loopback always works."""
    python_env: str | None = None
    """A prepared virtual environment bound read-only at the same path; its bin/ leads PATH.
    The workspace is put on PYTHONPATH so imports resolve to the agent's copy of the code."""
    ro_binds: tuple[str, ...] = ()
    """Extra host paths bound read-only at the same path (e.g. a shared model cache)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every exec."""
    scratch_dir: str | None = None
    """Host directory the workspace copies are made in (default: the system temp dir). A tmpfs such
    as /dev/shm makes create+close several times faster and costs RAM for every open copy."""
    server_url: str | None = None
    """remote backend: base URL of `carl env serve`."""
    server_token: str | None = None
    """remote backend: the server's bearer token (default: $CARL_ENV_TOKEN)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"sandbox.backend: got {self.backend!r}, expected one of {', '.join(BACKENDS)}")
        for name in ("timeout_s", "memory_mb", "cpu_s", "cpus", "max_procs", "disk_mb", "max_file_bytes",
                     "max_output_bytes"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name}: got {getattr(self, name)!r}, expected a positive number")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    """The command's exit status; -N when killed by signal N; 124 on timeout."""
    stdout: str
    stderr: str
    timed_out: bool = False
    duration_s: float = 0.0
    truncated: bool = False

    @property
    def output(self) -> str:
        """stdout and stderr joined, as a tool shows them."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the workspace
    is_dir: bool
    size: int


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, crashed, server gone): an infrastructure failure."""


class SandboxPathError(ValueError):
    """A path escapes the workspace or does not exist; tools turn it into an observation."""


@runtime_checkable
class Sandbox(Protocol):
    workdir: str
    """The workspace path as commands inside the sandbox see it."""

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str = ".",
        env: dict[str, str] | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run a command (a string runs under `bash -c`, a list runs as argv) in the workspace."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes) -> None:
        """Create or overwrite a file, creating parent directories."""
        ...

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]: ...

    def close(self) -> None:
        """Kill everything still running and delete the workspace. Idempotent."""
        ...
