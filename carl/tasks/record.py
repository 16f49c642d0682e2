"""TaskRecord: one feature-deletion task, in SWE-bench / SWE-smith field conventions.

A record names a broken copy of a repository (a feature was deleted from it), the gold patch that
turns it back into the original, and the tests that decide success: FAIL_TO_PASS (fail on the
broken repo, pass on the original) and PASS_TO_PASS (pass on both). The fields after
`created_at` are carl's own; records written by SWE-bench / SWE-smith tools load with defaults
for them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

DELETION_MODES = ("stub", "remove")
DELETION_KINDS = ("function", "method", "class", "module", "cluster")


@dataclass(frozen=True)
class TaskRecord:
    instance_id: str
    """Unique id, `<repo>__<version>-<kind>-<mode>-<short hash>`."""
    repo: str
    """Repository (or PyPI package) name."""
    version: str = ""
    base_commit: str = ""
    """Revision of the source when it was a git repository; else the source hash."""
    patch: str = ""
    """The gold patch: a unified diff (a/ b/ prefixes, apply with `patch -p1`) that turns the
    broken repo back into the original. Touches non-test files only."""
    test_patch: str = ""
    """Always empty: tests are never changed."""
    FAIL_TO_PASS: tuple[str, ...] = ()
    """pytest node ids that fail on the broken repo and pass on the original."""
    PASS_TO_PASS: tuple[str, ...] = ()
    """pytest node ids that pass on both."""
    problem_statement: str = ""
    created_at: str = ""
    # ---- carl's fields
    deletion_mode: str = "stub"
    """"stub" (signature and docstring kept, body raises NotImplementedError) or "remove"."""
    deletion_kind: str = "function"
    """"function", "method", "class", "module" or "cluster"."""
    deleted_symbols: tuple[str, ...] = ()
    """Qualified names of what was deleted, `module.path:Qual.name`."""
    size_lines: int = 0
    """Lines removed from the original by the deletion."""
    size_files: int = 0
    """Files the deletion changed."""
    source_hash: str = ""
    """sha256 of the original source tree (see carl.tasks.sources.tree_hash)."""
    test_command: tuple[str, ...] = ()
    """argv prefix that runs tests from the repo root; node ids are appended."""
    test_files: tuple[str, ...] = ()
    """Repo-relative paths of test files and test config the reward must restore."""
    environment: dict[str, Any] = field(default_factory=dict)
    """{"python": "3.11", "requirements": [...], "exclude": [distributions uninstalled],
    "path": venv dir, "env": {...}, "pythonpath": ["src"] or []}. "path" holds on the machine
    that built the task; python, requirements and exclude pin the venv, which
    `carl.tasks.environment.resolve_env` re-creates from them anywhere else."""
    broken_repo: str = ""
    """Directory of the scrubbed broken repo snapshot (a sandbox is created from it)."""
    test_timings: dict[str, float] = field(default_factory=dict)
    """node id -> seconds of its call phase on the original code."""

    def __post_init__(self) -> None:
        if self.deletion_mode not in DELETION_MODES:
            raise ValueError(f"deletion_mode: got {self.deletion_mode!r}, expected one of {DELETION_MODES}")
        if self.deletion_kind not in DELETION_KINDS:
            raise ValueError(f"deletion_kind: got {self.deletion_kind!r}, expected one of {DELETION_KINDS}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskRecord:
        """Build from a dict; unknown keys are ignored, missing carl fields get defaults.

        SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; both forms load.
        """
        if "instance_id" not in d:
            raise ValueError("task record: missing required field 'instance_id'")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for k, v in d.items():
            if k not in known or v is None:
                continue
            if k in ("FAIL_TO_PASS", "PASS_TO_PASS", "deleted_symbols", "test_files", "test_command"):
                v = _as_str_tuple(k, v)
            elif k in ("size_lines", "size_files"):
                v = int(v)
            elif k in ("environment", "test_timings") and isinstance(v, str):
                v = json.loads(v) if v else {}
            elif k in ("version", "base_commit", "created_at") and not isinstance(v, str):
                v = str(v)
            kwargs[k] = v
        return cls(**kwargs)


def _as_str_tuple(name: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        if name == "test_command" and not v.lstrip().startswith("["):
            import shlex

            return tuple(shlex.split(v))
        v = json.loads(v) if v.strip() else []
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"task record: field {name!r} must be a list of strings, got {type(v).__name__}")
    return tuple(str(x) for x in v)
