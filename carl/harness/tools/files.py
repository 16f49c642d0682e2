"""File tools: read_file, write_file, edit_file (exact search/replace), list_dir.

Paths are relative to the workspace; the sandbox rejects paths that leave it (SandboxPathError,
shown to the model as an execution error). Files are read and written as UTF-8; bytes that are
not UTF-8 are shown as U+FFFD by read_file and make edit_file refuse the file.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.sandbox.base import Sandbox

_PATH = ParamSpec("path", "str", "file path relative to the repository root")


def _read_text(sandbox: Sandbox, path: str, strict: bool = False) -> str:
    data = sandbox.read_file(path)
    if b"\0" in data[:8192]:
        raise ToolFailure(f"{path} is a binary file ({len(data)} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        if strict:
            raise ToolFailure(f"{path} is not valid UTF-8 text; rewrite it with write_file") from None
        return data.decode("utf-8", errors="replace")


def number_lines(lines: list[str], first: int) -> str:
    """`lines` (without newlines) numbered from `first`, one `   12\\tcode` row each."""
    return "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))


class ReadFile:
    spec = ToolSpec(
        name="read_file",
        description="Read a text file, shown with line numbers (the numbers are not part of the file).",
        params=(
            _PATH,
            ParamSpec("start_line", "int", "first line to show (1-based)", required=False),
            ParamSpec("end_line", "int", "last line to show (inclusive)", required=False),
        ),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        path = params["path"]
        lines = _read_text(sandbox, path).splitlines()
        start = params.get("start_line", 1)
        end = params.get("end_line", max(len(lines), start))
        if start < 1 or end < start:
            raise ToolFailure(f"bad line range {start}-{end}: need 1 <= start_line <= end_line")
        if not lines:
            return f"{path}: empty file"
        if start > len(lines):
            raise ToolFailure(f"start_line {start} is past the end of {path} ({len(lines)} lines)")
        end = min(end, len(lines))
        header = f"{path} (lines {start}-{end} of {len(lines)})"
        return header + "\n" + number_lines(lines[start - 1 : end], start)


class WriteFile:
    spec = ToolSpec(
        name="write_file",
        description="Create or overwrite a file with exactly the given content (parent directories are created).",
        params=(_PATH, ParamSpec("content", "str", "the complete new content of the file")),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        data = params["content"].encode("utf-8")
        sandbox.write_file(params["path"], data)
        nlines = params["content"].count("\n") + (0 if params["content"].endswith("\n") else 1)
        return f"Wrote {params['path']}: {nlines if data else 0} lines, {len(data)} bytes."


class EditFile:
    spec = ToolSpec(
        name="edit_file",
        description=(
            "Replace one exact occurrence of `old` in a file with `new`. `old` must match the file "
            "character for character (indentation included) and exactly once; include enough "
            "surrounding lines to make it unique."
        ),
        params=(
            _PATH,
            ParamSpec("old", "str", "the exact text to replace (must occur exactly once)"),
            ParamSpec("new", "str", "the replacement text"),
        ),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        path, old, new = params["path"], params["old"], params["new"]
        if not old:
            raise ToolFailure("<old> is empty; to create or overwrite a whole file use write_file")
        text = _read_text(sandbox, path, strict=True)
        count = text.count(old)
        if count == 0:
            raise ToolFailure(f"<old> does not occur in {path}." + _near_misses(text, old))
        if count > 1:
            starts = _occurrence_lines(text, old)
            raise ToolFailure(
                f"<old> occurs {count} times in {path} (starting at lines {', '.join(map(str, starts))}); "
                "include more surrounding lines so it matches exactly once."
            )
        at = text.index(old)
        new_text = text[:at] + new + text[at + len(old) :]
        sandbox.write_file(path, new_text.encode("utf-8"))
        first = text.count("\n", 0, at) + 1
        return f"Edited {path}.\n" + _context(new_text, first, new.count("\n") + 1)


def _occurrence_lines(text: str, old: str) -> list[int]:
    lines, at = [], text.find(old)
    while at != -1:
        lines.append(text.count("\n", 0, at) + 1)
        at = text.find(old, at + 1)
    return lines


def _near_misses(text: str, old: str) -> str:
    """A hint for a failed match: whether it matches up to whitespace, else the closest lines."""

    def squash(s: str) -> str:
        return " ".join(s.split())

    if squash(old) and squash(old) in squash(text):
        return " It matches if whitespace is ignored: check indentation, tabs and trailing spaces."
    first = next((line for line in old.splitlines() if line.strip()), "")
    lines = text.splitlines()
    close = difflib.get_close_matches(first, lines, n=3, cutoff=0.6)
    if not close:
        return ""
    shown = [f"{lines.index(c) + 1:6d}\t{c}" for c in close]
    return " Most similar lines in the file:\n" + "\n".join(shown)


def _context(text: str, first: int, nlines: int, around: int = 3) -> str:
    """Lines first..first+nlines-1 of `text` with `around` lines either side, numbered."""
    lines = text.splitlines()
    lo, hi = max(first - around, 1), min(first + nlines - 1 + around, len(lines))
    return number_lines(lines[lo - 1 : hi], lo)


class ListDir:
    spec = ToolSpec(
        name="list_dir",
        description="List a directory's entries (directories end with /, files show their size).",
        params=(
            ParamSpec(
                "path", "str", "directory relative to the repository root", required=False, default="."
            ),
        ),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        entries = sorted(sandbox.list_files(params["path"]), key=lambda e: (not e.is_dir, e.path))
        if not entries:
            return f"{params['path']}: empty directory"
        return "\n".join(f"{e.path}/" if e.is_dir else f"{e.path}  ({e.size} bytes)" for e in entries)
