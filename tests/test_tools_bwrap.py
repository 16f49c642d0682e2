"""The tools that run programs (rg, ruff, pytest, bash) also work inside the bubblewrap sandbox,
where only /usr, the workspace and the bound Python environment are visible."""

from __future__ import annotations

import shutil

import pytest
from tools_sandbox import make_repo, open_test_sandbox

from carl.harness.execute import run_calls
from carl.harness.protocol import parse_calls
from carl.harness.tools import default_tools, specs_of

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("rg") is None, reason="needs bubblewrap and ripgrep"
)

SOURCE = {
    "calc.py": "import os\n\n\ndef add(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}


def test_lint_grep_tests_and_edit_in_bwrap(tmp_path):
    tools = default_tools()
    specs = specs_of(tools)
    with open_test_sandbox(make_repo(tmp_path / "src", SOURCE), backend="bwrap") as sb:
        message = (
            '<tool name="lint"><path>calc.py</path></tool>'
            '<tool name="grep"><pattern>def add</pattern></tool>'
            '<tool name="run_tests"></tool>'
            '<tool name="run_terminal"><command>cat /etc/shadow; ls ~ 2>&1 | head -1</command></tool>'
        )
        lint, grep, tests, term = run_calls(parse_calls(message, specs), tools, sb)
        assert lint.ok and "calc.py:1:8: F401" in lint.output
        assert grep.output == "calc.py:4:def add(a, b):"
        assert tests.ok and tests.output.startswith("Tests: 1 failed (exit code 1")
        assert "root:" not in term.output
        fix = '<tool name="edit_file"><path>calc.py</path><old>a - b</old><new>a + b</new></tool>'
        assert run_calls(parse_calls(fix, specs), tools, sb)[0].ok
        [tests] = run_calls(
            parse_calls('<tool name="run_tests"><tests>tests</tests></tool>', specs), tools, sb
        )
        assert tests.output.startswith("Tests: 1 passed (exit code 0")
