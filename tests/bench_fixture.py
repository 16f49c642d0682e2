"""A small bench suite built by the real `carl bench build`, for the bench tests.

The `mini` fixture package (tests/tasks_fixture.py) is its one source; the project's own venv
stands in for a prepared environment (it has pytest and not the fixture package), pytest plugin
autoload is off so each run starts fast, and the sandbox is bwrap when available. Nothing is
downloaded.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tasks_fixture import MINI_FILES, write_repo

BACKEND = "bwrap" if shutil.which("bwrap") else "local"


def write_suite_files(root: Path, max_per_repo: int = 8, max_per_package: int = 6, smoke: int = 2,
                      extra: str = "") -> Path:
    """The mini repo, a catalog for it and a suite definition under `root`; returns the definition."""
    if not (root / "mini").exists():
        write_repo(root / "mini", MINI_FILES)
    (root / "catalog.jsonl").write_text(json.dumps({
        "name": "mini", "test_command": "python -m pytest -q -p no:cacheprovider",
        "env": {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}}) + "\n")
    suite = root / "tiny.toml"
    suite.write_text(f'''name = "tiny"
description = "the mini fixture package"
sources = ["mini"]

[build]
catalog = "catalog.jsonl"
max_per_repo = {max_per_repo}
python_env = "{sys.prefix}"
audit_env = false
backend = "{BACKEND}"
task_timeout_s = 60.0
suite_timeout_s = 120.0

[select]
max_per_package = {max_per_package}

[smoke]
per_package = {smoke}
{extra}''')
    return suite


def build_suite(root: Path, out: Path, *args: str) -> tuple[int, Path]:
    """`carl bench build` of the tiny suite into `out`; (exit code, definition)."""
    from carl.cli import main

    suite = root / "tiny.toml"
    if not suite.exists():
        write_suite_files(root)
    return main(["bench", "build", str(suite), "--out", str(out), *args]), suite
