"""glob and grep (ripgrep inside the sandbox)."""

from __future__ import annotations

import shutil

import pytest
from tools_sandbox import make_repo, open_test_sandbox

from carl.harness.tools.base import ToolFailure
from carl.harness.tools.search import Glob, Grep, glob_to_regex

SOURCE = {
    "src/pkg/a.py": "def alpha():\n    return 'needle'\n",
    "src/pkg/sub/b.py": "x = 1  # needle here\n",
    "src/c.txt": "no match\n",
    "tests/test_a.py": "from pkg.a import alpha\n",
    "__pycache__/junk.py": "needle\n",
}


@pytest.fixture
def sandbox(tmp_path):
    sb = open_test_sandbox(make_repo(tmp_path / "src", SOURCE))
    yield sb
    sb.close()


@pytest.mark.parametrize(
    "pattern,path,expected",
    [
        ("*.py", "src/pkg/sub/b.py", True),
        ("src/*.py", "src/pkg/a.py", False),
        ("src/**/*.py", "src/pkg/a.py", True),
        ("src/**/*.py", "src/a.py", True),
        ("**/test_?.py", "tests/test_a.py", True),
        ("src/pkg/[ab].py", "src/pkg/a.py", True),
        ("src/pkg/[!ab].py", "src/pkg/a.py", False),
        ("src/pkg/[a-c].py", "src/pkg/b.py", True),
        ("a.py", "src/pkg/a.py", True),
        ("a.py", "src/pkg/ba.py", False),
    ],
)
def test_glob_to_regex(pattern, path, expected):
    assert bool(glob_to_regex(pattern).match(path)) is expected


def test_glob_lists_matching_files_sorted_without_noise_dirs(sandbox):
    assert Glob().run({"pattern": "**/*.py"}, sandbox).splitlines() == [
        "src/pkg/a.py",
        "src/pkg/sub/b.py",
        "tests/test_a.py",
    ]
    assert Glob().run({"pattern": "*.rs"}, sandbox) == "No files match '*.rs'."


needs_rg = pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep not installed")


@needs_rg
def test_grep_prints_path_line_text(sandbox):
    out = Grep().run({"pattern": "need+le", "path": "."}, sandbox)
    assert out.splitlines() == [
        "src/pkg/a.py:2:    return 'needle'",
        "src/pkg/sub/b.py:1:x = 1  # needle here",
    ]


@needs_rg
def test_grep_path_glob_and_no_match(sandbox):
    assert (
        Grep().run({"pattern": "needle", "path": "src/pkg/sub"}, sandbox)
        == "src/pkg/sub/b.py:1:x = 1  # needle here"
    )
    assert (
        Grep().run({"pattern": "needle", "path": ".", "glob": "a.py"}, sandbox).startswith("src/pkg/a.py:2:")
    )
    assert Grep().run({"pattern": "absent", "path": "."}, sandbox) == "No matches for 'absent'."


@needs_rg
def test_grep_bad_regex_is_a_tool_failure(sandbox):
    with pytest.raises(ToolFailure, match="rg failed"):
        Grep().run({"pattern": "(unclosed", "path": "."}, sandbox)
