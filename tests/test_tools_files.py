"""read_file, write_file, edit_file, list_dir through a sandbox, and the output cap."""

from __future__ import annotations

import pytest
from tools_sandbox import make_repo, open_test_sandbox

from carl.harness.tools.base import ToolFailure, cap_output
from carl.harness.tools.files import EditFile, ListDir, ReadFile, WriteFile
from carl.sandbox.base import SandboxPathError

SOURCE = {
    "pkg/a.py": "def f():\n    return 1\n\n\ndef g():\n    return 1\n",
    "pkg/b.py": "".join(f"line {i}\n" for i in range(1, 21)),
    "README.md": "hello\n",
}


@pytest.fixture
def sandbox(tmp_path):
    sb = open_test_sandbox(make_repo(tmp_path / "src", SOURCE))
    yield sb
    sb.close()


def test_read_file_numbers_lines_and_honours_ranges(sandbox):
    out = ReadFile().run({"path": "pkg/b.py", "start_line": 3, "end_line": 4}, sandbox)
    assert out == "pkg/b.py (lines 3-4 of 20)\n     3\tline 3\n     4\tline 4"
    whole = ReadFile().run({"path": "pkg/b.py"}, sandbox)
    assert whole.count("\n") == 20 and whole.endswith("    20\tline 20")
    assert ReadFile().run({"path": "pkg/b.py", "start_line": 19, "end_line": 99}, sandbox).endswith("line 20")


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"start_line": 0}, "bad line range"),
        ({"start_line": 5, "end_line": 4}, "bad line range"),
        ({"start_line": 21}, "past the end"),
    ],
)
def test_read_file_bad_ranges_are_tool_failures(sandbox, params, needle):
    with pytest.raises(ToolFailure, match=needle):
        ReadFile().run({"path": "pkg/b.py", **params}, sandbox)


def test_paths_outside_the_workspace_are_rejected(sandbox):
    with pytest.raises(SandboxPathError):
        ReadFile().run({"path": "../../etc/passwd"}, sandbox)


def test_write_file_creates_parents_and_writes_exactly(sandbox):
    content = "x = '<&>'\n\ttab\nno newline at end"
    out = WriteFile().run({"path": "new/dir/c.py", "content": content}, sandbox)
    assert out == f"Wrote new/dir/c.py: 3 lines, {len(content.encode())} bytes."
    assert sandbox.read_file("new/dir/c.py") == content.encode()


def test_edit_file_replaces_the_unique_match_and_shows_context(sandbox):
    out = EditFile().run(
        {"path": "pkg/a.py", "old": "def g():\n    return 1", "new": "def g():\n    return 2"}, sandbox
    )
    assert sandbox.read_file("pkg/a.py").decode() == "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    assert out.startswith("Edited pkg/a.py.") and "     6\t    return 2" in out


def test_edit_file_multiple_matches_names_count_and_lines(sandbox):
    with pytest.raises(ToolFailure, match=r"occurs 2 times in pkg/a.py \(starting at lines 2, 6\)"):
        EditFile().run({"path": "pkg/a.py", "old": "    return 1", "new": "    return 3"}, sandbox)
    assert sandbox.read_file("pkg/a.py").decode() == SOURCE["pkg/a.py"]  # unchanged


def test_edit_file_no_match_hints_at_whitespace_or_similar_lines(sandbox):
    with pytest.raises(ToolFailure, match="whitespace is ignored"):
        EditFile().run({"path": "pkg/a.py", "old": "def f():\n  return 1", "new": ""}, sandbox)
    with pytest.raises(ToolFailure, match=r"does not occur(.|\n)*Most similar lines(.|\n)*1\tdef f\(\):"):
        EditFile().run({"path": "pkg/a.py", "old": "def f(x):", "new": ""}, sandbox)
    with pytest.raises(ToolFailure, match="empty"):
        EditFile().run({"path": "pkg/a.py", "old": "", "new": "x"}, sandbox)


def test_list_dir_shows_dirs_first_with_sizes(sandbox):
    out = ListDir().run({"path": "."}, sandbox)
    lines = out.splitlines()
    assert lines[0] == "pkg/" and "README.md  (6 bytes)" in lines
    assert ListDir().run({"path": "pkg"}, sandbox).splitlines()[0].startswith("pkg/a.py  (")


def test_cap_output_keeps_head_and_tail_and_says_how_much_was_cut():
    text = "".join(f"row {i:05d}\n" for i in range(5000))  # 50,000 chars
    capped, truncated = cap_output(text, 2000)
    assert truncated and len(capped) <= 2000
    assert capped.startswith("row 00000\n") and capped.endswith("row 04999\n")
    marker = next(line for line in capped.splitlines() if line.startswith("[... truncated"))
    cut_chars = int(marker.split()[2])
    kept = capped.replace(marker + "\n", "")  # head + tail, lines intact
    head, tail = capped.split("\n" + marker + "\n")
    assert text.startswith(head + "\n") and text.endswith(tail)
    assert cut_chars == len(text) - len(kept)
    assert int(marker.split()[4].strip("(")) == 5000 - kept.count("\n")
    assert cap_output("short", 2000) == ("short", False)
