"""Remove from a tree everything that could reveal deleted code (DESIGN 1.3).

Cursor saw its model recover deleted signatures from a leftover type-checker cache and
decompile bytecode; so bytecode, type-checker and tool caches, VCS history, build output,
egg-info and coverage data all go. `find_leaks` lists what `scrub_tree` would remove, which is
how the audit checks that a tree is clean.
"""

from __future__ import annotations

import shutil
from pathlib import Path

LEAKY_DIRS = {
    "__pycache__",
    ".mypy_cache",
    ".pytype",
    ".pyre",
    ".pyright",
    ".dmypy",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".tox",
    ".nox",
    ".eggs",
    ".git",
    ".hg",
    ".svn",
    ".bzr",
    "htmlcov",
    ".benchmarks",
    ".cache",
    ".ipynb_checkpoints",
}
"""Directory names removed wherever they appear."""
ROOT_LEAKY_DIRS = {"build", "dist"}
"""Removed only at the root: a subpackage may well be called `build`."""
LEAKY_DIR_SUFFIXES = (".egg-info", ".dist-info")
LEAKY_FILE_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".orig", ".rej")
"""Compiled code (a .so could be a compiled copy of the deleted module) and patch leftovers."""
LEAKY_FILE_NAMES = {".coverage", "coverage.xml", ".dmypy.json", "pyrightconfig.cache", ".gitignore.orig"}
LEAKY_FILE_PREFIXES = (".coverage.",)


def find_leaks(root: Path) -> list[str]:
    """Repo-relative paths of leaky files and directories under root (directories not descended)."""
    out: list[str] = []
    stack = [root]
    while stack:
        d = stack.pop()
        for entry in sorted(d.iterdir(), key=lambda p: p.name):
            rel = str(entry.relative_to(root))
            if entry.is_dir() and not entry.is_symlink():
                if (
                    entry.name in LEAKY_DIRS
                    or entry.name.endswith(LEAKY_DIR_SUFFIXES)
                    or (d == root and entry.name in ROOT_LEAKY_DIRS)
                ):
                    out.append(rel)
                else:
                    stack.append(entry)
            elif (
                entry.suffix in LEAKY_FILE_SUFFIXES
                or entry.name in LEAKY_FILE_NAMES
                or entry.name.startswith(LEAKY_FILE_PREFIXES)
            ):
                out.append(rel)
    return sorted(out)


def scrub_tree(root: Path) -> list[str]:
    """Delete every leak `find_leaks` reports; return what was removed."""
    removed = find_leaks(root)
    for rel in removed:
        p = root / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    return removed
