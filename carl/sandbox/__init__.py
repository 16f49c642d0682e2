"""Sandboxes: a private copy of a repository to run an agent's commands in.

    with open_sandbox("path/to/repo", SandboxConfig(backend="bwrap")) as sb:
        res = sb.exec("pytest -q", timeout_s=60)
        sb.write_file("src/x.py", b"...")

Backends (`BACKENDS`, the one list every CLI and config takes its choices from): "bwrap"
(default; bubblewrap namespaces, see carl.sandbox.bwrap), "gvisor" (gVisor's runsc, a user-space
kernel between the agent and the host, see carl.sandbox.gvisor), "local" (no isolation at all;
development only), "remote" (a `carl env serve` server, see carl.sandbox.client). What each
does not guarantee is written in docs/sandbox.md.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from carl.sandbox.base import (
    BACKENDS,
    HOST_BACKENDS,
    ExecResult,
    FileEntry,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxPathError,
)

__all__ = [
    "BACKENDS",
    "HOST_BACKENDS",
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
    module_name, class_name = BACKENDS[config.backend].split(":")
    return getattr(importlib.import_module(module_name), class_name)(source_dir, config)
