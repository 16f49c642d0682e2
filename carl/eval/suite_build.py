"""`carl bench build`: a suite definition -> a suite directory (carl.eval.suite), and its lock.

    SUITE.toml --SuiteConfig.specs()--> each source not finished in DIR/pool.jsonl (resumable):
                  carl.tasks.build.build_repo --> DIR/pool.jsonl + DIR/pool.store/
      --> per package: select_tasks, smoke_tasks
      --> no SUITE.lock.json next to SUITE.toml (or --update-lock): the lock of this build is written
          there and into DIR
          a lock there: the suite is the lock's tasks; check_lock says which are missing (not
          built, or built differently) and which the rule picks now that the lock does not list
      --> DIR/tasks.jsonl, smoke.jsonl, suite.lock.json, suite.toml, catalog.jsonl, build.json

The lock pins what makes a task: per package its source (PyPI pin, git commit, tree hash of
the scrubbed source) and Python version; per task its id, sha256 of its gold patch and of its
test lists, and its strata; the smoke ids; and the definition's settings that decide which tasks
come out (not the worker count, sandbox backend or local paths, which do not). It holds nothing
that changes between machines or runs, so two builds that made the same tasks write the same
bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from carl.eval.strata import STRATA, order_values, task_strata
from carl.eval.suite import SuiteConfig, select_tasks, smoke_tasks
from carl.tasks.record import TaskRecord

LOCK_FORMAT = 1


def lock_path(suite_file: str | Path) -> Path:
    """Where a definition's lock lives: beside it, `NAME.lock.json` for `NAME.toml`."""
    p = Path(suite_file)
    return p.with_name(p.stem + ".lock.json")


def build_pool(config: SuiteConfig, out: Path, build_cfg, on_start: Callable[[str], Any],
               on_task: Callable[[Any], None], on_done: Callable[[Any], None],
               only: frozenset[str] | None = None) -> None:
    """Run the task pipeline on every source of the suite not finished in `out`/pool.jsonl
    (`carl.tasks.build.finished_specs`: a rerun continues where a killed build stopped).
    `only`: validate just these task ids (`--smoke-only`: the lock's smoke subset)."""
    from carl.tasks.build import RepoResult, build_repo, finished_specs, record_finished

    pool = out / "pool.jsonl"
    done = finished_specs(pool)
    for spec in config.specs():
        if spec in done:
            on_done(RepoResult(spec, status="skipped"))
            continue
        on_start(spec)
        mine = dataclasses.replace(build_cfg, max_per_repo=config.build_for(package_key(spec)[0]).max_per_repo)
        result = build_repo(spec, pool, mine, on_task=on_task, only=only)
        record_finished(pool, result)
        on_done(result)


@dataclass
class LockCheck:
    """How this build compares with the lock it was built against."""

    missing: list[str] = field(default_factory=list)
    """Locked tasks this build did not make (or made differently: `changed`); not in the suite."""
    changed: list[str] = field(default_factory=list)
    """Locked ids this build made with another gold patch or other tests."""
    new: list[str] = field(default_factory=list)
    """Tasks the selection rule picks from this build that the lock does not list (not in the suite)."""
    settings: list[str] = field(default_factory=list)
    """Settings that differ from the lock's: "field: lock value -> now"."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.changed or self.settings)


@dataclass
class SuiteBuild:
    tasks: list[TaskRecord]
    smoke: list[TaskRecord]
    lock: dict[str, Any]
    """The lock of the suite written (the reference lock when one was checked)."""
    check: LockCheck | None
    """None when no lock was checked (the first build, or --update-lock)."""
    kept: dict[str, int]
    """source key (repo, version) -> tasks of that package in the suite."""
    smoke_only: bool = False
    """Built with --smoke-only: `tasks` is the smoke subset, and no tasks.jsonl is written."""


def finish_suite(config: SuiteConfig, out: Path, reference: dict[str, Any] | None,
                 smoke_only: bool = False) -> SuiteBuild:
    """Select the suite from `out`/pool.jsonl and check it against the `reference` lock (None: no
    lock, the selection is the suite). `smoke_only` (a reference is needed): the suite is the lock's
    smoke subset alone, checked task by task as the whole one is. Writes nothing."""
    from carl.tasks import load_tasks

    pool = load_tasks(out / "pool.jsonl") if (out / "pool.jsonl").is_file() else []
    by_package: dict[tuple[str, str], list[TaskRecord]] = {}
    for t in {t.instance_id: t for t in pool}.values():
        by_package.setdefault((t.repo, t.version), []).append(t)
    order = [package_key(spec) for spec in config.specs()]
    chosen = [t for key in order for t in select_tasks(by_package.get(key, []), config)]
    smoke = [t for key in order for t in smoke_tasks([t for t in chosen if (t.repo, t.version) == key], config)]
    fresh = make_lock(config, chosen, smoke)
    if reference is None:
        return SuiteBuild(chosen, smoke, fresh, None, _kept(chosen))
    built = {t.instance_id: t for t in pool}
    check = LockCheck(settings=_settings_diff(reference.get("settings", {}), fresh["settings"]))
    tasks = []
    smoke_ids = set(reference.get("smoke", []))
    for entry in reference.get("tasks", []):
        if smoke_only and entry["instance_id"] not in smoke_ids:
            continue
        iid = entry["instance_id"]
        if iid not in built:
            check.missing.append(iid)
            continue
        now = _task_entry(built[iid], config)
        if any(entry.get(k) != now[k] for k in ("patch_sha256", "tests_sha256")):
            check.missing.append(iid)
            check.changed.append(iid)
        else:
            tasks.append(built[iid])
    locked = {e["instance_id"] for e in reference.get("tasks", [])}
    # a smoke-only pool holds just the smoke ids: the selection rule cannot be rerun on it
    check.new = [] if smoke_only else sorted(t.instance_id for t in chosen if t.instance_id not in locked)
    in_suite = {t.instance_id for t in tasks}
    smoke = [built[i] for i in reference.get("smoke", []) if i in in_suite]
    return SuiteBuild(tasks, smoke, reference, check, _kept(tasks), smoke_only)


def package_key(spec: str) -> tuple[str, str]:
    """(repo, version) as the pipeline writes them into a SOURCE's task records."""
    from carl.tasks.sources import parse_source

    source, _, _ = parse_source(spec)
    return source.name, source.version


def _kept(tasks: list[TaskRecord]) -> dict[str, int]:
    return dict(Counter(t.repo + (f"=={t.version}" if t.version else "") for t in tasks))


def make_lock(config: SuiteConfig, tasks: list[TaskRecord], smoke: list[TaskRecord]) -> dict[str, Any]:
    """The lock of a suite (see the module docstring): plain JSON, sorted, the same bytes for the
    same tasks."""
    packages = []
    for spec in config.specs():
        name, version = package_key(spec)
        mine = [t for t in tasks if (t.repo, t.version) == (name, version)]
        first = mine[0] if mine else None
        packages.append({
            "name": name,
            "version": version,
            "source": spec if spec.startswith("pypi:") else ("git" if "@" in spec else "dir"),
            "base_commit": first.base_commit if first else "",
            "source_hash": first.source_hash if first else "",
            "python": first.environment.get("python", "") if first else "",
            "tasks": len(mine),
        })
    counts = {s: Counter(task_strata(t, config.strata)[s] for t in tasks) for s in STRATA}
    return _plain({
        "format": LOCK_FORMAT,
        "suite": config.name,
        "settings": lock_settings(config),
        "packages": packages,
        "tasks": [_task_entry(t, config) for t in tasks],
        "smoke": [t.instance_id for t in smoke],
        "counts": {"tasks": len(tasks), "smoke": len(smoke),
                   **{s: {v: counts[s][v] for v in order_values(s, set(counts[s]), config.strata)}
                      for s in STRATA}},
    })


def _task_entry(t: TaskRecord, config: SuiteConfig) -> dict[str, Any]:
    tests = json.dumps([sorted(t.FAIL_TO_PASS), sorted(t.PASS_TO_PASS)]).encode()
    return {
        "instance_id": t.instance_id,
        "repo": t.repo,
        "deletion_mode": t.deletion_mode,
        "patch_sha256": hashlib.sha256(t.patch.encode()).hexdigest(),
        "tests_sha256": hashlib.sha256(tests).hexdigest(),
        "size_lines": t.size_lines,
        "size_files": t.size_files,
        "fail_to_pass": len(t.FAIL_TO_PASS),
        "strata": task_strata(t, config.strata),
    }


def lock_settings(config: SuiteConfig) -> dict[str, Any]:
    """What of the definition decides which tasks come out: the packages' catalog entries, the
    other sources (kind, name, revision), the pipeline's settings but its machine-side ones
    (workers, backend, python_env, the catalog's path), selection, smoke and strata."""
    from carl.tasks.catalog import read_catalog

    catalog = read_catalog(config.build.catalog) if config.packages else {}
    build = {k: v for k, v in dataclasses.asdict(config.build).items()
             if k not in ("workers", "backend", "python_env", "catalog")}
    sources = []
    for spec in config.sources:
        name, version = package_key(spec)
        sources.append({"kind": "pypi" if spec.startswith("pypi:") else ("git" if "@" in spec else "dir"),
                        "name": name, "version": version})
    return _plain({
        "packages": [dataclasses.asdict(catalog[p.lower()]) for p in config.packages],
        "sources": sources,
        "build": build,
        "select": dataclasses.asdict(config.select),
        "smoke": dataclasses.asdict(config.smoke),
        "strata": dataclasses.asdict(config.strata),
    })


def _plain(obj: Any) -> Any:
    """Tuples to lists, as JSON reads them back, so a lock compares equal to its own file."""
    return json.loads(json.dumps(obj, sort_keys=True))


def _settings_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _settings_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {json.dumps(a)[:120]} in the lock -> {json.dumps(b)[:120]} now")
    return out


def write_suite(config: SuiteConfig, out: Path, result: SuiteBuild) -> None:
    """The suite directory's files (all but build.json): tasks, smoke subset, lock, resolved
    definition and its catalog. Task lines are the pool's own (paths relative to `out`)."""
    from carl.config import to_toml
    from carl.io import atomic_write_json, atomic_write_text, read_jsonl

    lines = {d["instance_id"]: d for d in read_jsonl(out / "pool.jsonl")} if (out / "pool.jsonl").is_file() else {}

    def jsonl(tasks: list[TaskRecord]) -> str:
        return "".join(json.dumps(lines[t.instance_id], sort_keys=True) + "\n" for t in tasks)

    if not result.smoke_only:  # a smoke-only build has no tasks.jsonl: open_suite says what to do
        atomic_write_text(out / "tasks.jsonl", jsonl(result.tasks))
    atomic_write_text(out / "smoke.jsonl", jsonl(result.smoke))
    atomic_write_json(out / "suite.lock.json", result.lock)
    build = config.build
    if config.packages:
        catalog = {k.lower(): k for k in config.packages}
        rows = [line for line in Path(build.catalog).read_text().splitlines()
                if line.strip() and json.loads(line).get("name", "").lower() in catalog]
        atomic_write_text(out / "catalog.jsonl", "".join(r + "\n" for r in rows))
        build = dataclasses.replace(build, catalog="catalog.jsonl")
    header = f"# the definition `carl bench build` built this suite from ({time.strftime('%Y-%m-%d')})\n"
    atomic_write_text(out / "suite.toml", header + to_toml(dataclasses.replace(config, build=build)))
