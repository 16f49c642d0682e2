"""run_terminal: a bash command in the sandbox, with a timeout that kills its whole process group."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.sandbox.base import ExecResult, Sandbox


def format_exec(res: ExecResult, timeout_s: float) -> str:
    """Output of a command followed by a status line the model can rely on. A timeout names the
    limit, not the measured wall time, so that the same episode reads the same tokens on a rerun
    (as run_tests shows no wall times)."""
    if res.timed_out:
        status = f"[timed out after {timeout_s:g} s; the command and its children were killed]"
    else:
        status = f"[exit code {res.exit_code}]"
    out = res.output.rstrip("\n")
    return (out + "\n" if out else "") + status


class RunTerminal:
    def __init__(self, default_timeout_s: float = 60.0, max_timeout_s: float = 600.0) -> None:
        self.default_timeout_s = default_timeout_s
        self.max_timeout_s = max_timeout_s
        self.spec = ToolSpec(
            name="run_terminal",
            description=(
                "Run a bash command in the repository root and show its output (stdout and "
                "stderr) and exit code. No network. Each call is a fresh shell."
            ),
            params=(
                ParamSpec("command", "str", "the bash command line"),
                ParamSpec(
                    "timeout_s",
                    "int",
                    f"seconds before the command is killed (at most {max_timeout_s:g})",
                    required=False,
                    default=int(default_timeout_s),
                ),
            ),
        )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        if not params["command"].strip():
            raise ToolFailure("<command> is empty")
        timeout_s = params.get("timeout_s", self.default_timeout_s)
        if not 0 < timeout_s <= self.max_timeout_s:
            raise ToolFailure(f"<timeout_s> must be between 1 and {self.max_timeout_s:g}, got {timeout_s}")
        return format_exec(sandbox.exec(params["command"], timeout_s=timeout_s), timeout_s)
