"""run_tests: pytest inside the sandbox, summarised as counts and failing test ids.

The summary comes first and is never cut; the raw pytest output follows, capped (head and tail)
so that the whole observation stays under the tool output cap.

Wall-clock durations are left out by default (carl's "2.2 s" and pytest's "in 0.11s"): they say
nothing about correctness and made the same episode's tokens differ from run to run, so that a
seed's warm-start data, and everything trained on it, did not reproduce (measured: of 32 expert
episodes of the default run twice, every difference was one of those two numbers).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec, cap_output
from carl.sandbox.base import Sandbox

PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "--tb=short")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
_SUMMARY_LINE = re.compile(
    r"^(?:=+ )?(?:.*\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)|no tests ran)"
    r".* in [\d.]+s(?: \([^)]*\))?(?: =+)?$"
)
_SUMMARY_DURATION = re.compile(r" in [\d.]+s(?: \(\d+:\d\d:\d\d\))?(?=(?: =+)?$)")
_FAILED_ID = re.compile(r"^(FAILED|ERROR) (\S+)")
EXIT_MEANINGS = {
    0: "all selected tests passed",
    1: "some tests failed",
    2: "interrupted (e.g. a collection error)",
    3: "internal pytest error",
    4: "pytest usage error",
    5: "no tests were collected",
}


@dataclass(frozen=True)
class TestSummary:
    __test__ = False  # not a pytest test class, despite the name
    counts: dict[str, int] = field(default_factory=dict)  # "passed", "failed", "error", "skipped", ...
    failed: tuple[str, ...] = ()  # test ids reported FAILED
    errors: tuple[str, ...] = ()  # test ids (or files) reported ERROR


def parse_pytest_output(output: str) -> TestSummary:
    """Counts from pytest's final summary line and failing ids from its short test summary."""
    counts: dict[str, int] = {}
    for line in reversed(output.splitlines()):
        if _SUMMARY_LINE.match(line.strip()):
            for n, what in _COUNT.findall(line):
                counts["error" if what.startswith("error") else what] = int(n)
            break
    failed, errors = [], []
    for line in output.splitlines():
        if m := _FAILED_ID.match(line):
            (failed if m.group(1) == "FAILED" else errors).append(m.group(2))
    return TestSummary(counts=counts, failed=tuple(failed), errors=tuple(errors))


class RunTests:
    def __init__(
        self, timeout_s: float = 300.0, max_output_chars: int = 20_000, python: str = "python3",
        durations: bool = False,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.python = python
        self.durations = durations  # wall-clock times in the observation (see the module docstring)
        self.spec = ToolSpec(
            name="run_tests",
            description=(
                f"Run pytest ({' '.join(PYTEST_ARGS)}) in the repository root and summarise "
                "passed/failed/error counts and failing test ids, followed by pytest's output."
            ),
            params=(
                ParamSpec(
                    "tests",
                    "str",
                    "space-separated test files, directories or node ids "
                    "(e.g. tests/test_a.py::test_x); all tests when omitted",
                    required=False,
                ),
            ),
        )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        try:
            selected = shlex.split(params.get("tests") or "")
        except ValueError as e:
            raise ToolFailure(f"cannot split <tests> into test ids: {e}") from None
        res = sandbox.exec([self.python, "-m", "pytest", *PYTEST_ARGS, *selected], timeout_s=self.timeout_s)
        output = res.output.rstrip("\n")
        summary = parse_pytest_output(output)
        duration_s = res.duration_s if self.durations else None
        head = _format_summary(summary, res.exit_code, res.timed_out, self.timeout_s, duration_s)
        if not self.durations:
            output = without_durations(output)
        body, _ = cap_output(output, max(self.max_output_chars - len(head) - 100, 200))
        return f"{head}\n--- pytest output ---\n{body}"


def without_durations(output: str) -> str:
    """pytest's output with the wall time cut from its final summary line(s) ("2 passed in 0.11s",
    "=== 1 failed in 65.20s (0:01:05) ===" -> "2 passed", "=== 1 failed ===")."""
    return "\n".join(_SUMMARY_DURATION.sub("", line) if _SUMMARY_LINE.match(line.strip()) else line
                     for line in output.split("\n"))


def _format_summary(
    s: TestSummary, exit_code: int, timed_out: bool, timeout_s: float, duration_s: float | None
) -> str:
    if timed_out:
        status = f"timed out after {timeout_s:g} s (the test run was killed)"
    else:
        status = f"exit code {exit_code}: {EXIT_MEANINGS.get(exit_code, 'unexpected exit code')}"
    order = ["passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected"]
    counts = ", ".join(f"{s.counts[k]} {k}" for k in order if s.counts.get(k)) or "no test results"
    lines = [f"Tests: {counts} ({status})" if duration_s is None else f"Tests: {counts} ({status}, {duration_s:.1f} s)"]
    if s.failed:
        lines += ["Failed:"] + [f"  {t}" for t in s.failed]
    if s.errors:
        lines += ["Errors:"] + [f"  {t}" for t in s.errors]
    return "\n".join(lines)
