"""Search tools: glob (file names) and grep (ripgrep over contents, run inside the sandbox)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from carl.harness.tools.base import ParamSpec, ToolFailure, ToolSpec
from carl.sandbox.base import Sandbox

# Directories nobody wants in a file listing; the agent can still list_dir or read into them.
NOISE_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        "node_modules",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".eggs",
    }
)
MAX_GLOB_MATCHES = 1000


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regex for a glob over '/'-separated relative paths: `*` and `?` stay within one
    path component, `**/` matches zero or more directories, `[...]` is a character class.
    A pattern without '/' matches the file name in any directory (like ripgrep's --glob)."""
    if "/" not in pattern:
        pattern = "**/" + pattern
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (j := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : j].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body[0] in "!^" else body) + "]")
            i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


class Glob:
    spec = ToolSpec(
        name="glob",
        description=(
            "Find files whose path matches a glob pattern, e.g. `**/*.py` or `src/*/test_*.py` "
            "(`*` stays within a directory, `**/` spans directories; a pattern without `/` "
            "matches file names anywhere)."
        ),
        params=(ParamSpec("pattern", "str", "glob pattern relative to the repository root"),),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        pattern = params["pattern"].strip()
        if not pattern:
            raise ToolFailure("<pattern> is empty")
        regex = glob_to_regex(pattern.removeprefix("./"))
        paths = sorted(
            e.path
            for e in sandbox.list_files(".", recursive=True)
            if not e.is_dir and not NOISE_DIRS.intersection(e.path.split("/")[:-1]) and regex.match(e.path)
        )
        if not paths:
            return f"No files match {pattern!r}."
        more = len(paths) - MAX_GLOB_MATCHES
        shown = "\n".join(paths[:MAX_GLOB_MATCHES])
        return shown + (f"\n[... {more} more files; use a narrower pattern]" if more > 0 else "")


class Grep:
    spec = ToolSpec(
        name="grep",
        description=(
            "Search file contents with ripgrep (a Rust regex, case-sensitive); prints "
            "`path:line:text` for each match. Skips hidden, git-ignored and cache directories."
        ),
        params=(
            ParamSpec("pattern", "str", "regular expression to search for"),
            ParamSpec("path", "str", "file or directory to search in", required=False, default="."),
            ParamSpec("glob", "str", "only search files matching this glob, e.g. *.py", required=False),
        ),
    )

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str:
        argv = [
            "rg",
            "--line-number",
            "--no-heading",
            "--with-filename",
            "--color",
            "never",
            "--sort",
            "path",
            "--max-columns",
            "300",
            "--max-columns-preview",
        ]
        for noise in sorted(NOISE_DIRS):
            argv += ["--glob", f"!{noise}"]
        if params.get("glob"):
            argv += ["--glob", params["glob"]]
        argv += ["-e", params["pattern"]]
        path = params["path"].strip()
        if path not in ("", ".", "./"):  # without a path rg prints paths relative to the root, no "./"
            argv += ["--", path]
        res = sandbox.exec(argv, timeout_s=60)
        if res.exit_code == 1 and not res.stderr.strip():
            return f"No matches for {params['pattern']!r}."
        if res.exit_code not in (0, 1) or res.timed_out:
            raise ToolFailure(
                f"rg failed (exit code {res.exit_code}): {res.stderr.strip() or res.stdout.strip()}"
            )
        return res.stdout.rstrip("\n")
