"""Where tasks live on disk, and how to load them.

A task file `DIR/NAME.jsonl` (one TaskRecord a line, append-only) has its store next to it:

    DIR/NAME.store/
        originals/<source_hash[:16]>/   the scrubbed original tree of each repo (for gold checks)
        broken/<instance_id>/           the scrubbed broken repo of each task (sandboxes copy it)
        repos.jsonl                     one line per finished repo (build resumes from it)
        drops.jsonl                     one line per dropped candidate: its reason, and a detail
                                        where one place is to blame (where a leak was found)

Paths inside records are written relative to DIR, so a task file and its store move together;
`load_tasks` makes them absolute. Prepared virtual environments are shared by all task files in
`$CARL_CACHE_DIR/envs/<requirements hash>` (default `~/.cache/carl/envs`); a record pins what
its venv holds, and `sandbox_config_for` re-creates it there when the recorded path is not a
venv for those pins on this machine.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from pathlib import Path
from typing import Any

from carl.io import append_jsonl, atomic_write_text, read_jsonl_numbered
from carl.sandbox.base import SandboxConfig
from carl.tasks.record import TaskRecord


def cache_dir() -> Path:
    """carl's cache root: $CARL_CACHE_DIR, else ~/.cache/carl."""
    return Path(os.environ.get("CARL_CACHE_DIR") or Path.home() / ".cache" / "carl")


def store_dir(tasks_path: str | Path) -> Path:
    """The store directory that belongs to a task file."""
    p = Path(tasks_path)
    return p.with_name(p.stem + ".store")


def load_tasks(path: str | Path, require_repos: bool = False) -> list[TaskRecord]:
    """Read a task JSONL file; relative `broken_repo` / environment paths become absolute.

    With `require_repos` (anything that will run episodes), every task's broken repo must exist:
    a task file copied away from its store would otherwise fail every episode in its sandbox."""
    from carl.errors import UserError

    path = Path(path)
    if not path.is_file():
        raise UserError(f"task file {str(path)!r} does not exist")
    base = path.resolve().parent
    try:
        rows = read_jsonl_numbered(path)
    except ValueError as e:  # not UTF-8 or not JSON; it names the file and line
        raise UserError(f"task file {e}") from None
    tasks = []
    for lineno, d in rows:
        tasks.append(_absolute(_record(d, f"task file {path}:{lineno}"), base))
    if require_repos:
        missing = [t for t in tasks if not t.broken_repo or not Path(t.broken_repo).is_dir()]
        if missing:
            raise UserError(
                f"task file {str(path)!r}: {len(missing)} of {len(tasks)} tasks have no broken repo on disk, "
                f"e.g. task {missing[0].instance_id!r}: broken_repo {missing[0].broken_repo!r} is not a directory "
                f"(relative paths resolve against the task file's folder {str(base)!r}; keep the file beside "
                f"its {store_dir(path).name}/ or write one with `carl tasks build`)")
    return tasks


def write_tasks(path: str | Path, tasks: list[TaskRecord]) -> None:
    """Write (replace) a task file atomically."""
    import json

    text = "".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in tasks)
    atomic_write_text(path, text)


def append_task(path: str | Path, task: TaskRecord) -> None:
    """Append one record (fsynced; a crash loses at most this line)."""
    append_jsonl(path, task.to_dict())


def broken_repo_dir(task: TaskRecord) -> Path:
    """The directory a sandbox for this task is created from (the scrubbed broken repo)."""
    if not task.broken_repo:
        raise ValueError(f"task {task.instance_id}: no broken_repo (record not built by carl tasks build)")
    return Path(task.broken_repo)


def original_repo_dir(task: TaskRecord) -> Path:
    """The scrubbed original tree of the task's repo (broken repo + gold patch, kept on disk)."""
    return broken_repo_dir(task).parent.parent / "originals" / task.source_hash[:16]


def sandbox_config_for(task: TaskRecord, base: SandboxConfig) -> SandboxConfig:
    """`base` with the task's prepared venv as python_env and the task's env vars added.

    The venv is the record's path when that is a venv for the record's pins on this machine,
    else the one re-created from the pins (`carl.tasks.environment.resolve_env`: the first call
    for a repo on a new machine may install its requirements). PYTHONPATH entries (e.g. `src`
    for a src layout) are relative to the workspace, which is the working directory of every
    exec; test_command also carries `-o pythonpath=...` for pytest.
    """
    from carl.tasks.environment import resolve_env  # it imports this module

    env = dict(base.env)
    env.update(task.environment.get("env", {}))
    pythonpath = task.environment.get("pythonpath") or []
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*pythonpath, "."])
    return dataclasses.replace(base, python_env=resolve_env(task), env=env)


def relative_to_tasks_file(path: Path, tasks_path: str | Path) -> str:
    """How a store path is written into a record: relative to the task file's directory."""
    base = Path(tasks_path).resolve().parent
    try:
        return str(Path(path).resolve().relative_to(base))
    except ValueError:
        return str(Path(path).resolve())


def _record(d: Any, where: str) -> TaskRecord:
    """A TaskRecord from one JSON line, or a UserError naming `where`, what was wrong and what was
    expected."""
    from carl.errors import UserError

    if not isinstance(d, dict):
        raise UserError(f"{where}: got a JSON {type(d).__name__}, expected a task record (a JSON object)")
    try:
        t = TaskRecord.from_dict(d)  # reads the SWE-bench forms (lists as JSON strings)
    except (ValueError, TypeError) as e:
        raise UserError(f"{where}: {e}; expected a task record (carl.tasks.record.TaskRecord)") from None
    # from_dict leaves other values as they came: check each against its field's type (shallowly:
    # a deep check of every test id costs more than the parse, and from_dict made those strings).
    for name, kind in _field_kinds().items():
        value = getattr(t, name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            shown = repr(value) if len(repr(value)) <= 100 else repr(value)[:100] + "..."
            raise UserError(f"{where}: {name}: got {shown}, expected {_KIND_NAMES[kind]}")
    if not all(isinstance(x, (int, float)) for x in t.test_timings.values()):
        raise UserError(f"{where}: test_timings: expected a JSON object of seconds (numbers)")
    return t


_KIND_NAMES = {str: "a string", int: "an integer", tuple: "a list of strings", dict: "a JSON object"}


@functools.cache
def _field_kinds() -> dict[str, type]:
    """TaskRecord field -> the type its value must have: str, int, tuple or dict."""
    return {name: typing.get_origin(tp) or tp for name, tp in typing.get_type_hints(TaskRecord).items()}


def _absolute(t: TaskRecord, base: Path) -> TaskRecord:
    changes = {}
    if t.broken_repo and not os.path.isabs(t.broken_repo):
        changes["broken_repo"] = str(base / t.broken_repo)
    env_path = t.environment.get("path")
    if env_path and not os.path.isabs(env_path):
        changes["environment"] = {**t.environment, "path": str(base / env_path)}
    return dataclasses.replace(t, **changes) if changes else t
