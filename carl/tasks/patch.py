"""Unified diffs between two trees, and a strict applier.

`tree_diff(old, new, files)` writes the diff that turns `old` into `new` (git-style `a/` `b/`
prefixes, `/dev/null` for created or deleted files), applicable with `patch -p1`.
`apply_patch(root, diff)` applies such a diff exactly: every context and removed line must match
at the hunk's stated position, else PatchError.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

NO_EOL = "\\ No newline at end of file\n"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    pass


def file_diff(rel: str, old: str | None, new: str | None) -> str:
    """Unified diff of one file; None means the file does not exist on that side."""
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(
        a, b, "/dev/null" if old is None else f"a/{rel}", "/dev/null" if new is None else f"b/{rel}", n=3
    ):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + NO_EOL)
    return "".join(out)


def tree_diff(old_root: Path, new_root: Path, files: list[str]) -> str:
    """Diff of the given repo-relative files from old_root to new_root, in sorted order."""
    parts = []
    for rel in sorted(files):
        old, new = old_root / rel, new_root / rel
        parts.append(
            file_diff(rel, read_text(old) if old.exists() else None, read_text(new) if new.exists() else None)
        )
    return "".join(parts)


def diff_stats(diff: str) -> tuple[int, int, int]:
    """(files, added lines, removed lines) of a unified diff."""
    files = added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+++ "):
            files += 1
        elif line.startswith("+") and not line.startswith("+++ "):
            added += 1
        elif line.startswith("-") and not line.startswith("--- "):
            removed += 1
    return files, added, removed


def apply_patch(root: Path, diff: str) -> list[str]:
    """Apply a unified diff under root; return the repo-relative paths it touched."""
    lines = diff.splitlines(keepends=True)
    touched = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        old_name = lines[i][4:].strip()
        new_name = (
            lines[i + 1][4:].strip() if i + 1 < len(lines) and lines[i + 1].startswith("+++ ") else None
        )
        if new_name is None:
            raise PatchError(f"line {i + 2}: expected '+++' after '---'")
        i += 2
        rel = (new_name if new_name != "/dev/null" else old_name).split("/", 1)[1]
        path = root / rel
        text = read_text(path) if old_name != "/dev/null" else ""
        if old_name != "/dev/null" and not path.exists():
            raise PatchError(f"{rel}: file to patch does not exist")
        src = text.splitlines(keepends=True)
        out: list[str] = []
        pos = 0  # index into src of the next line not yet copied
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchError(f"line {i + 1}: bad hunk header {lines[i]!r}")
            old_start = int(m.group(1))
            old_left = int(m.group(2)) if m.group(2) is not None else 1
            new_left = int(m.group(4)) if m.group(4) is not None else 1
            old_start = old_start - 1 if old_start > 0 and old_left > 0 else old_start
            if old_start < pos:
                raise PatchError(f"{rel}: overlapping hunks")
            out.extend(src[pos:old_start])
            pos = old_start
            i += 1
            # Consume exactly the hunk's counted lines, so a following '--- ' header is not read as a removal.
            while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i] == NO_EOL):
                if i >= len(lines):
                    raise PatchError(f"{rel}: hunk ends early")
                tag, body = lines[i][0], lines[i][1:]
                if tag == "\\":
                    i += 1
                    continue
                if i + 1 < len(lines) and lines[i + 1] == NO_EOL and body.endswith("\n"):
                    body = body[:-1]
                if tag not in (" ", "-", "+"):
                    raise PatchError(f"line {i + 1}: unexpected {lines[i]!r} inside a hunk")
                if tag in (" ", "-"):
                    if pos >= len(src) or src[pos] != body:
                        raise PatchError(f"{rel}: hunk does not match at line {pos + 1}")
                    pos += 1
                    old_left -= 1
                if tag in (" ", "+"):
                    out.append(body)
                    new_left -= 1
                i += 1
        out.extend(src[pos:])
        if new_name == "/dev/null":
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="") as f:
                f.write("".join(out))
        touched.append(rel)
    return touched


def read_text(path: Path) -> str:
    """File text with line endings kept exactly (no universal-newline translation)."""
    with open(path, newline="") as f:
        return f.read()
