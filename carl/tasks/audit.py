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
    out = []
    for line in text.splitlines():
        line = _WS.sub(" ", line.strip())
        if line and not line.startswith("#"):
            out.append(line)
    return "\n".join(out)


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
    """Problems found (empty = clean)."""
    problems = [f"leftover artifact {rel}" for rel in find_leaks(broken_root)]
    if blocks:
        workspace = text_index(broken_root, TEXT_SUFFIXES)
        for block in blocks:
            first = block.splitlines()[0]
            if block in workspace:
                problems.append(f"deleted source found in the workspace: {first[:80]!r}")
            if env_index and block in env_index:
                problems.append(f"deleted source found in the environment: {first[:80]!r}")
    return problems


def installed_copies(site_packages: Path, packages: tuple[str, ...]) -> list[str]:
    """Top-level names of the package under test that are importable from the environment."""
    return [
        name
        for name in packages
        if (site_packages / name).exists() or (site_packages / f"{name}.py").exists()
    ]
