"""Catalogs: what `carl tasks build` should know about a package that its source does not say.

A catalog is a JSONL file, one package a line (`docs/tasks.md`, "Catalogs", describes every
field; `configs/catalog.example.jsonl` is one). The pipeline reads `name`, `test_command`,
`test_deps` and `env`; `version` and `sdist_sha256` pin the package's SOURCE
(`CatalogEntry.source`). Other fields (what the suite gave when it was measured: `n_tests`,
`test_seconds`, ...) describe the package for people and are not read.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from carl.errors import UserError
from carl.io import read_jsonl_numbered


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    """Distribution name; a SOURCE whose name (a PyPI name, or a directory's name) equals it,
    ignoring case, is built with this entry."""
    version: str = ""
    """The version the entry was measured on (for `source`)."""
    sdist_sha256: str = ""
    """sha256 of that version's sdist (for `source`; checked after the download)."""
    test_command: str = ""
    """`python -m pytest OPTIONS... [PATHS...]`, run from the package root; "" for the default
    (`python -m pytest -q -p no:cacheprovider --color=no`)."""
    test_deps: tuple[str, ...] = ()
    """Requirement strings the tests need, installed with the package's runtime dependencies;
    empty for the default (pytest plus the `test` / `tests` / `testing` extras)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every test run (added to carl's pure-Python switches)."""

    @property
    def source(self) -> str:
        """The entry as a pinned SOURCE for `carl tasks build`: `pypi:NAME==VERSION[#sha256=HEX]`."""
        if not self.version:
            raise UserError(f"catalog entry {self.name!r}: no version, so no pypi:NAME==VERSION source")
        pinned = f"#sha256={self.sdist_sha256}" if self.sdist_sha256 else ""
        return f"pypi:{self.name}=={self.version}{pinned}"


def read_catalog(path: str | Path) -> dict[str, CatalogEntry]:
    """Lower-cased name -> entry, for every line of the catalog; a UserError naming the file,
    line and field for anything malformed (a name listed twice included)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"catalog {str(path)!r} does not exist; expected a JSONL file, one package a line")
    try:
        rows = read_jsonl_numbered(path)
    except ValueError as e:  # names the file and line
        raise UserError(f"catalog {e}") from None
    entries: dict[str, CatalogEntry] = {}
    first_line: dict[str, int] = {}
    for lineno, d in rows:
        entry = _entry(d, f"catalog {path}:{lineno}")
        key = entry.name.lower()
        if key in entries:
            raise UserError(f"catalog {path}:{lineno}: {entry.name!r} is listed on line {first_line[key]} "
                            "already; expected one line a package")
        entries[key], first_line[key] = entry, lineno
    return entries


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _entry(d, where: str) -> CatalogEntry:
    if not isinstance(d, dict):
        raise UserError(f"{where}: got a JSON {type(d).__name__}, expected an object with at least a 'name'")

    def check(name: str, ok, expected: str) -> None:
        try:
            good = ok(d[name]) if name in d else True
        except ValueError:  # shlex: an unclosed quote
            good = False
        if not good:
            raise UserError(f"{where}: {name}: got {d[name]!r}, expected {expected}")

    if "name" not in d:
        raise UserError(f"{where}: no 'name'; expected the package's distribution name")
    check("name", lambda v: isinstance(v, str) and v.strip(), "a package name")
    check("version", lambda v: isinstance(v, str), "a version string")
    check("sdist_sha256", lambda v: isinstance(v, str) and _SHA256.fullmatch(v), "64 lower-case hex digits")
    check("test_command", lambda v: isinstance(v, str) and shlex.split(v)[:3] == ["python", "-m", "pytest"],
          "'python -m pytest ...'")
    check("test_deps", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
          "a list of requirement strings")
    check("env", lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
          "an object of string values")
    return CatalogEntry(
        name=d["name"],
        version=d.get("version", ""),
        sdist_sha256=d.get("sdist_sha256", ""),
        test_command=d.get("test_command", ""),
        test_deps=tuple(d.get("test_deps", ())),
        env=dict(d.get("env", {})),
    )
