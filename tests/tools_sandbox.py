"""Sandboxes for the tool tests: a repo written from a dict, opened with the real backends."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from carl.sandbox import SandboxConfig, open_sandbox


def make_repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def open_test_sandbox(source: Path, backend: str = "local"):
    """A sandbox over a copy of `source` whose python (and ruff, next to it) is this venv's."""
    with warnings.catch_warnings():  # the local backend warns that it isolates nothing; we know
        warnings.simplefilter("ignore")
        return open_sandbox(str(source), SandboxConfig(backend=backend, timeout_s=30, python_env=sys.prefix))
