"""The local backend: a temp-dir copy of the repository and plain processes. It isolates NOTHING.

Commands run as the host user, see the whole host filesystem and network, and can write
anywhere that user can. What it does give: a private copy of the repository (edits never reach
the source or another sandbox), a wall-clock limit that kills the command's process group,
per-process rlimits (CPU seconds, address space; the process limit is *not* applied, since
RLIMIT_NPROC counts every process of the host user and would break the host), and capped
output. A child that calls setsid() leaves the process group and survives the timeout.
Use it for development on machines without bubblewrap, never for untrusted code.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from carl.sandbox.base import ExecResult, FileEntry, SandboxConfig, SandboxError
from carl.sandbox.process import kill_group, run_process
from carl.sandbox.scratch import Scratch, copy_tree, scratch_prefix
from carl.sandbox.workspace import Workspace

_warned = False

# Host variables that would change how the sandbox's Python and its test runs behave (a
# PYTEST_ADDOPTS naming a plugin the task's environment lacks fails every test run; a host
# PYTHONPATH or PYTHONSTARTUP runs host code): a test's outcome must not depend on the shell
# that started carl. The isolated backends start from a fixed environment (host.sandbox_env).
_STEERING_PREFIXES = ("PYTEST_", "PYTHON", "COV_CORE_", "COVERAGE_")


def host_env() -> dict[str, str]:
    """os.environ without the variables that steer Python or pytest."""
    return {k: v for k, v in os.environ.items() if not k.startswith(_STEERING_PREFIXES)}


class LocalSandbox:
    """A private temp-dir copy of source_dir; commands run on the host with rlimits and a timeout."""

    def __init__(self, source_dir: str | Path, config: SandboxConfig | None = None):
        _warn_once()
        self.config = config or SandboxConfig(backend="local")
        self._scratch = Scratch(scratch_prefix("local"), self.config.scratch_dir, disk_mb=None)
        try:
            copy_tree(Path(source_dir), self._scratch.path / "workspace")
        except BaseException:
            self._scratch.close()
            raise
        self._ws = Workspace(self._scratch.path / "workspace", max_file_bytes=self.config.max_file_bytes)
        self.workdir = str(self._ws.root)
        self._running: set[int] = set()
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
        workdir = self._ws.root / self._ws.directory(cwd)
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        limits = [f"--as={self.config.memory_mb * 1024 * 1024}", f"--cpu={self.config.cpu_s}", "--core=0"]
        full_env = host_env()
        if self.config.python_env:
            venv = Path(self.config.python_env)
            full_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{full_env.get('PATH', '')}"
            full_env["VIRTUAL_ENV"] = str(venv)
        full_env["PYTHONPATH"] = self.workdir
        full_env.update(self.config.env)
        full_env.update(env or {})
        return run_process(
            ["prlimit", *limits, "--", *argv] if shutil.which("prlimit") else argv,
            timeout_s=timeout_s or self.config.timeout_s,
            max_output_bytes=self.config.max_output_bytes,
            cwd=str(workdir),
            env=full_env,
            stdin=stdin,
            running=self._running,
        )

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
        if not self._closed:
            self._closed = True
            for pgid in list(self._running):
                kill_group(pgid)
            self._scratch.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "carl: the 'local' sandbox backend isolates NOTHING: commands run as you, on your "
            "filesystem and network. Use backend 'bwrap' for untrusted code.",
            stacklevel=3,
        )
