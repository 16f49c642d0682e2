"""Sandboxes: a private copy of a repository to run an agent's commands in.

    with open_sandbox("path/to/repo", SandboxConfig(backend="bwrap")) as sb:
        res = sb.exec("pytest -q", timeout_s=60)
        sb.write_file("src/x.py", b"...")

Backends: "bwrap" (default; bubblewrap namespaces, see carl.sandbox.bwrap), "local" (no
isolation at all; development only), "remote" (a `carl env serve` server, see
carl.sandbox.client). What each does not guarantee is written in docs/sandbox.md.
"""

from __future__ import annotations

from pathlib import Path

from carl.sandbox.base import ExecResult, FileEntry, Sandbox, SandboxConfig, SandboxError, SandboxPathError

__all__ = [
    "ExecResult",
    "FileEntry",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxPathError",
    "open_sandbox",
]


def open_sandbox(source_dir: str | Path, config: SandboxConfig | None = None) -> Sandbox:
    """A fresh sandbox over a private copy of source_dir (a context manager; close() when done).

    For the remote backend, source_dir is uploaded as a tar.gz unless it is prefixed with
    "server:", which names a path on the server's own filesystem. config defaults to SandboxConfig().
    """
    config = config or SandboxConfig()
    if config.backend == "local":
        from carl.sandbox.local import LocalSandbox

        return LocalSandbox(source_dir, config)
    if config.backend == "bwrap":
        from carl.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(source_dir, config)
    from carl.sandbox.client import RemoteSandbox

    return RemoteSandbox(source_dir, config)
