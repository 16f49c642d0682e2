"""What is code and what is test in a repository tree.

Packages are directories with `__init__.py` at the root or under `src/` (the src layout, which
puts `src` on the import path). Test files are `test_*.py`, `*_test.py`, `conftest.py` and
anything under a `tests`/`test`/`testing` directory; test config (`pytest.ini`, `tox.ini`,
`setup.cfg`, `pyproject.toml` at the root) is counted with them, because the reward restores
all of these. Source files are the `.py` files of the packages that are not test files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEST_DIR_NAMES = {"tests", "test", "testing"}
TEST_CONFIG_FILES = ("pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
NOT_PACKAGES = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "build", "dist"}


@dataclass(frozen=True)
class Layout:
    pythonpath: tuple[str, ...]
    """Repo-relative dirs to put on sys.path: ("src",) for a src layout, else ()."""
    packages: tuple[str, ...]
    """Top-level importable names (packages and single-module files) of the repo."""
    source_files: tuple[str, ...]
    """Repo-relative .py files of the packages, tests excluded."""
    test_files: tuple[str, ...]
    """Repo-relative test files and test config."""

    def module_name(self, rel: str) -> str:
        """`src/pkg/sub/mod.py` -> `pkg.sub.mod`; `pkg/__init__.py` -> `pkg`."""
        parts = Path(rel).with_suffix("").parts
        if self.pythonpath and parts[: len(Path(self.pythonpath[0]).parts)] == Path(self.pythonpath[0]).parts:
            parts = parts[len(Path(self.pythonpath[0]).parts) :]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        return ".".join(parts)


def is_test_path(rel: str) -> bool:
    p = Path(rel)
    if p.name == "conftest.py" or p.name.startswith("test_") or p.name.endswith("_test.py"):
        return True
    return any(part in TEST_DIR_NAMES for part in p.parts[:-1])


def detect_layout(root: Path) -> Layout:
    src = root / "src"
    use_src = src.is_dir() and any((d / "__init__.py").is_file() for d in src.iterdir() if d.is_dir())
    base = src if use_src else root
    packages: list[str] = []
    source_files: list[str] = []
    for entry in sorted(base.iterdir()):
        if entry.name.startswith((".", "_")) or entry.name in NOT_PACKAGES or entry.name in TEST_DIR_NAMES:
            continue
        if entry.is_dir() and (entry / "__init__.py").is_file() and entry.name.isidentifier():
            packages.append(entry.name)
            for f in sorted(entry.rglob("*.py")):
                rel = str(f.relative_to(root))
                if not is_test_path(str(f.relative_to(base))):
                    source_files.append(rel)
        elif (
            entry.is_file()
            and entry.suffix == ".py"
            and entry.stem.isidentifier()
            and entry.name not in ("setup.py", "conftest.py", "noxfile.py", "fabfile.py")
            and not is_test_path(entry.name)
        ):
            packages.append(entry.stem)
            source_files.append(str(entry.relative_to(root)))
    test_files = sorted(
        str(f.relative_to(root))
        for f in root.rglob("*.py")
        if is_test_path(str(f.relative_to(root))) and not _hidden(f.relative_to(root))
    )
    test_files += [name for name in TEST_CONFIG_FILES if (root / name).is_file()]
    return Layout(("src",) if use_src else (), tuple(packages), tuple(source_files), tuple(test_files))


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)
