"""run_terminal, run_tests, lint and finish: commands run inside the sandbox."""

from __future__ import annotations

import re

import pytest
from tools_sandbox import make_repo, open_test_sandbox

from carl.harness.tools.base import ToolFailure
from carl.harness.tools.finish import Finish
from carl.harness.tools.lint import Lint, find_ruff
from carl.harness.tools.terminal import RunTerminal
from carl.harness.tools.tests import RunTests, parse_pytest_output, without_durations

SOURCE = {
    "calc.py": "import os\n\n\ndef add(a, b):\n    return a + b\n",
    "tests/test_calc.py": (
        "from calc import add\n\n\n"
        "def test_ok():\n    assert add(1, 2) == 3\n\n\n"
        "def test_bad():\n    assert add(1, 1) == 3\n"
    ),
    "tests/test_broken.py": "import nonexistent_module\n",
}


@pytest.fixture
def sandbox(tmp_path):
    sb = open_test_sandbox(make_repo(tmp_path / "src", SOURCE))
    yield sb
    sb.close()


def test_run_terminal_shows_output_and_exit_code(sandbox):
    out = RunTerminal().run({"command": "echo hi; echo err >&2; exit 3"}, sandbox)
    assert out == "hi\nerr\n[exit code 3]"


def test_run_terminal_timeout_is_reported(sandbox):
    out = RunTerminal().run({"command": "sleep 5", "timeout_s": 1}, sandbox)
    assert out.startswith("[timed out after 1 s; the command and its children were killed]")  # the limit
    with pytest.raises(ToolFailure, match="between 1 and 600"):
        RunTerminal().run({"command": "true", "timeout_s": 601}, sandbox)


def test_run_tests_summarises_counts_and_failing_ids(sandbox):
    out = RunTests(timeout_s=60).run({"tests": "tests/test_calc.py"}, sandbox)
    head = out.split("\n--- pytest output ---\n")[0]
    assert head.startswith("Tests: 1 passed, 1 failed (exit code 1: some tests failed)\n")
    assert head.endswith("Failed:\n  tests/test_calc.py::test_bad")
    assert "assert 2 == 3" in out


def test_run_tests_observation_has_no_wall_time_so_a_rerun_reads_the_same(sandbox):
    """Durations made identical episodes' tokens differ run to run (seeds did not reproduce)."""
    sandbox.write_file("tests/test_slow.py", b"import random, time\n\ndef test_s():\n"
                                             b"    time.sleep(random.uniform(0.01, 0.2))\n")
    runs = [RunTests(timeout_s=60).run({"tests": "tests/test_slow.py"}, sandbox) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert runs[0].startswith("Tests: 1 passed (exit code 0: all selected tests passed)\n")
    assert runs[0].rstrip().endswith("1 passed")
    timed = RunTests(timeout_s=60, durations=True).run({"tests": "tests/test_slow.py"}, sandbox)
    assert re.match(r"Tests: 1 passed \(exit code 0: all selected tests passed, [\d.]+ s\)", timed)
    assert re.search(r"1 passed in [\d.]+s$", timed.rstrip())


@pytest.mark.parametrize("line, want", [
    ("2 passed in 0.11s", "2 passed"),
    ("==== 3 passed, 1 warning in 0.01s ====", "==== 3 passed, 1 warning ===="),
    ("=== 1 failed, 2 passed in 65.20s (0:01:05) ===", "=== 1 failed, 2 passed ==="),
    ("===== no tests ran in 0.01s =====", "===== no tests ran ====="),
    ("FAILED t.py::a - AssertionError: in 3.2s", "FAILED t.py::a - AssertionError: in 3.2s"),  # not a summary
])
def test_without_durations_cuts_only_the_summarys_wall_time(line, want):
    assert without_durations(f"..F\n{line}") == f"..F\n{want}"


def test_run_tests_reports_collection_errors(sandbox):
    out = RunTests(timeout_s=60).run({}, sandbox)
    assert out.startswith("Tests: 1 error (exit code 2: interrupted")
    assert "Errors:\n  tests/test_broken.py" in out


def test_run_tests_output_respects_the_cap(sandbox):
    sandbox.write_file(
        "tests/test_many.py",
        "".join(f"def test_{i}():\n    assert False, 'x' * 300\n" for i in range(30)).encode(),
    )
    out = RunTests(timeout_s=60, max_output_chars=3000).run({"tests": "tests/test_many.py"}, sandbox)
    assert out.startswith("Tests: 30 failed") and "[... truncated" in out
    assert len(out) <= 3000 + 30 * 40  # the summary (one line per failing id) is never cut


def test_parse_pytest_output_reads_counts():
    s = parse_pytest_output(
        "....\nFAILED t.py::a - x\nERROR t.py::b\n2 failed, 5 passed, 1 skipped, 3 errors in 1.2s"
    )
    assert s.counts == {"failed": 2, "passed": 5, "skipped": 1, "error": 3}
    assert s.failed == ("t.py::a",) and s.errors == ("t.py::b",)
    assert parse_pytest_output("==== 3 passed, 1 warning in 0.01s ====").counts == {"passed": 3}


def test_lint_reports_ruff_problems_compactly(sandbox):
    out = Lint(find_ruff()).run({"path": "calc.py"}, sandbox)
    assert out.splitlines()[0] == "calc.py:1:8: F401 [*] `os` imported but unused"
    sandbox.write_file("clean.py", b"x = 1\n")
    assert Lint(find_ruff()).run({"path": "clean.py"}, sandbox) == "All checks passed!"
    assert ".ruff_cache" not in {e.path for e in sandbox.list_files(".")}


def test_finish_ends_the_episode():
    assert Finish.spec.ends_episode
    assert Finish().run({"message": "done "}, None) == "Episode finished. Summary: done"
