"""lint: `ruff check` inside the sandbox, one line per problem.

The ruff binary is found on the host (`find_ruff`) and run by absolute path, so a bubblewrap
sandbox must see that path: bind it read-only (`SandboxConfig(ro_binds=(dirname,))`) or use a
`python_env` that contains it. `--no-cache` keeps `.ruff_cache` out of the agent's workspace.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.sandbox.base import Sandbox


def find_ruff() -> str:
    """The ruff executable: next to the running Python (the project venv), else on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ruff")
    if found is None:
        raise FileNotFoundError("ruff not found next to the Python interpreter or on PATH; pip install ruff")
    return found


class Lint:
    def __init__(self, ruff: str | None = None) -> None:
        self.ruff = ruff  # resolved on first use, so building the tool list never fails
        self.spec = ToolSpec(
            name="lint",
            description="Check Python code with ruff (the repository's ruff settings apply); one line per problem.",
            params=(ParamSpec("path", "str", "file or directory to check", required=False, default="."),),
        )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        if self.ruff is None:
            self.ruff = find_ruff()
        argv = [
            self.ruff,
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "--no-fix",
            "--",
            params["path"],
        ]
        res = sandbox.exec(argv, timeout_s=120)
        out = res.output.rstrip("\n")
        if res.exit_code == 0:
            return out or "No problems found."
        if res.exit_code == 1:
            return out
        raise ToolFailure(f"ruff failed (exit code {res.exit_code}): {out}")
