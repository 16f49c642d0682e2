"""Audit a broken repo before anyone sees it: nothing may reveal the deleted code.

Two checks: no leaky artifact is left in the workspace (carl.tasks.scrub.find_leaks: bytecode,
type-checker caches, VCS data, ...), and no block of deleted source appears, after
normalisation, in any file of the workspace or of the prepared environment (an installed copy of
the package, a vendored duplicate, a doc page that quotes the code). Normalisation drops blank
and comment-only lines and collapses whitespace inside lines. Blocks shorter than
`MIN_BLOCK_CHARS` normalised characters are not searched: they are too generic to mean a leak
(`return None`).
"""

from __future__ import annotations

import re
from pathlib import Path

from carl.tasks.scrub import find_leaks

MIN_BLOCK_CHARS = 40
_WS = re.compile(r"\s+")
TEXT_SUFFIXES = {".py", ".pyi", ".txt", ".rst", ".md", ".cfg", ".toml", ".ini", ".json", ".yaml", ".yml", ""}


def normalise(text: str) -> str:
    return "\n".join(line for _, line in _normalised_lines(text))


def block_line(text: str, block: str) -> int:
    """The 1-based line of `text` where the normalised `block` is found, or 0 (not in it)."""
    lines = _normalised_lines(text)
    joined = "\n".join(line for _, line in lines)
    at = joined.find(block)
    return lines[joined.count("\n", 0, at)][0] if at >= 0 else 0


def locate_block(block: str, root: Path, rels) -> str:
    """"REL:LINE" of the first of the files `rels` (relative to root) that holds the normalised
    block, or "" (the block is in none of them)."""
    for rel in rels:
        try:
            line = block_line((root / rel).read_text(), block)
        except (UnicodeDecodeError, OSError):
            continue
        if line:
            return f"{rel}:{line}"
    return ""


def _normalised_lines(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line with whitespace collapsed) of the lines normalise keeps."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = _WS.sub(" ", line.strip())
        if line and not line.startswith("#"):
            out.append((i, line))
    return out


def deleted_blocks(forward_diff: str) -> list[str]:
    """Normalised runs of removed lines of a diff (original -> broken) worth searching for."""
    blocks, run = [], []
    for line in forward_diff.splitlines() + [""]:
        if line.startswith("-") and not line.startswith("--- "):
            run.append(line[1:])
            continue
        if run:
            block = normalise("\n".join(run))
            if len(block) >= MIN_BLOCK_CHARS and block.count("\n") >= 1:
                blocks.append(block)
            run = []
    return blocks


def text_index(root: Path, suffixes: set[str] | None = None) -> str:
    """Normalised text of every text file under root, joined (for substring search)."""
    parts = []
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.is_symlink():
            continue
        if suffixes is not None and p.suffix not in suffixes:
            continue
        try:
            parts.append(normalise(p.read_text(errors="strict")))
        except (UnicodeDecodeError, OSError):
            continue
    return "\n\0\n".join(parts)


def audit_tree(broken_root: Path, blocks: list[str], env_index: str) -> list[str]:
    """Problems found (empty = clean); a copy of deleted source is named with the file and line
    it was found at in the workspace (in the environment: what `env_index` holds is unnamed)."""
    problems = [f"leftover artifact {rel}" for rel in find_leaks(broken_root)]
    if blocks:
        workspace = text_index(broken_root, TEXT_SUFFIXES)
        rels = [str(p.relative_to(broken_root)) for p in sorted(broken_root.rglob("*"))
                if p.is_file() and not p.is_symlink() and p.suffix in TEXT_SUFFIXES]  # fmt: skip
        for block in blocks:
            if block in workspace:
                problems.append(leak_problem("the workspace", locate_block(block, broken_root, rels), block))
            if env_index and block in env_index:
                problems.append(leak_problem("the environment", "", block))
    return problems


def leak_problem(where: str, location: str, block: str) -> str:
    """How a copy of deleted source is reported: where (and at which REL:LINE) and its first line."""
    at = f" at {location}" if location else ""
    return f"deleted source found in {where}{at}: {block.splitlines()[0][:80]!r}"


def installed_copies(site_packages: Path, packages: tuple[str, ...]) -> list[str]:
    """Top-level names of the package under test that are importable from the environment."""
    return [
        name
        for name in packages
        if (site_packages / name).exists() or (site_packages / f"{name}.py").exists()
    ]
