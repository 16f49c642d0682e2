"""Bench suites: a pinned, reproducible set of feature-deletion tasks from real packages.

A suite definition (TOML, `SuiteConfig`) names its packages (entries of a catalog, each pinned
to a version and sdist hash) and any other sources (local directories, git revisions), the task
pipeline's settings (`carl.tasks.build.BuildConfig`), how many of a package's tasks go into the
suite and which (`SelectConfig`), the smoke subset for CPU models (`SmokeConfig`) and the
difficulty strata (`carl.eval.strata.StrataConfig`). `carl bench build` (carl.eval.suite_build)
turns it into a suite directory:

    DIR/suite.toml         the definition as built (paths resolved, the catalog copied beside it)
    DIR/catalog.jsonl      the catalog entries of its packages
    DIR/tasks.jsonl        the suite's tasks, by package, then selection order
    DIR/smoke.jsonl        the smoke subset (a subset of tasks.jsonl)
    DIR/suite.lock.json    what was built: pinned packages, task ids, their strata (suite_build)
    DIR/build.json         how the build went: per package, tasks built and kept, drops, wall time
    DIR/pool.jsonl         every task the pipeline made, with its store pool.store/ (the
                           broken repos the suite's tasks point into) and the resumable state

Selection never depends on the order in which parallel validation finished (it sorts by
instance id), so two builds of one definition that validate the same tasks select the same ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from carl.errors import UserError
from carl.eval.strata import StrataConfig, bucket
from carl.tasks.build import BuildConfig
from carl.tasks.record import DELETION_KINDS, TaskRecord


@dataclass(frozen=True)
class SelectConfig:
    max_per_package: int = 30
    """At most this many of a package's built tasks go into the suite (build.max_per_repo is how
    many the pipeline makes to choose from)."""
    rule: Literal["balanced", "by_id"] = "balanced"
    """"balanced": round-robin over the cells (deletion kind, lines-to-write bucket), each cell in
    instance-id order, so every kind and size a package gave is in before any repeats; "by_id":
    the first max_per_package in instance-id order (a hashed, seed-free sample of what was built)."""
    package_caps: dict[str, int] = field(default_factory=dict)
    """Package name -> its own cap, instead of max_per_package (a package whose every test run is
    slow); the pipeline then makes that many plus the same surplus (build.max_per_repo -
    max_per_package) of its tasks."""

    def __post_init__(self) -> None:
        if self.max_per_package < 1:
            raise ValueError(f"select.max_per_package: got {self.max_per_package}, expected >= 1")
        for name, cap in self.package_caps.items():
            if cap < 1:
                raise ValueError(f"select.package_caps.{name}: got {cap}, expected >= 1")


@dataclass(frozen=True)
class SmokeConfig:
    per_package: int = 2
    """The smoke subset takes this many of each package's suite tasks, the smallest first (fewest
    lines to write, then files, then failing tests, then by id); 0: no smoke subset."""

    def __post_init__(self) -> None:
        if self.per_package < 0:
            raise ValueError(f"smoke.per_package: got {self.per_package}, expected >= 0")


@dataclass(frozen=True)
class SuiteConfig:
    name: str
    """The suite's name (reports carry it); letters, digits, '.', '_' and '-'."""
    description: str = ""
    """One line for people: what the suite is for."""
    packages: tuple[str, ...] = ()
    """Names of entries of build.catalog, each built from its pinned source
    (pypi:NAME==VERSION#sha256=HEX, from the entry's version and sdist_sha256)."""
    sources: tuple[str, ...] = ()
    """Other SOURCEs, as `carl tasks build` takes them: DIR, DIR@REV (a git revision) or
    pypi:NAME==VERSION[#sha256=HEX]; a relative DIR is relative to the suite file."""
    build: BuildConfig = field(default_factory=BuildConfig)
    """The task pipeline's settings (carl.tasks.build.BuildConfig); build.catalog, relative to the
    suite file, holds the packages' entries (test command, test deps, env, pins)."""
    select: SelectConfig = field(default_factory=SelectConfig)
    """Which of a package's built tasks are the suite's."""
    smoke: SmokeConfig = field(default_factory=SmokeConfig)
    """The small subset for CPU models (`carl bench run --smoke`)."""
    strata: StrataConfig = field(default_factory=StrataConfig)
    """Bucket edges of the difficulty strata reports break pass@1 down by."""

    def __post_init__(self) -> None:
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise ValueError(f"name: got {self.name!r}, expected letters, digits, '.', '_' or '-'")
        if not self.packages and not self.sources:
            raise ValueError("packages / sources: both empty, expected at least one package or source")
        for what, items in (("packages", [p.lower() for p in self.packages]), ("sources", list(self.sources))):
            dup = sorted({x for x in items if items.count(x) > 1})
            if dup:
                raise ValueError(f"{what}: {dup[0]!r} is listed twice, expected each once")
        if self.packages and not self.build.catalog:
            raise ValueError("build.catalog: not set, expected the catalog that holds the packages' entries")
        names = {p.lower() for p in self.packages} | {_source_name(s).lower() for s in self.sources}
        for name in self.select.package_caps:
            if name.lower() not in names:
                raise ValueError(f"select.package_caps: {name!r} is not a package of the suite, expected one of "
                                 f"{sorted(names)}")

    def cap(self, package: str) -> int:
        """How many of `package`'s tasks the suite keeps."""
        caps = {k.lower(): v for k, v in self.select.package_caps.items()}
        return caps.get(package.lower(), self.select.max_per_package)

    def build_for(self, package: str) -> BuildConfig:
        """The pipeline's settings for `package`: its cap plus the suite's surplus to choose from."""
        surplus = max(0, self.build.max_per_repo - self.select.max_per_package)
        return dataclasses.replace(self.build, max_per_repo=self.cap(package) + surplus)

    def specs(self) -> list[str]:
        """The SOURCE of every package, then the other sources, in the order the suite lists them."""
        from carl.tasks.catalog import read_catalog

        catalog = read_catalog(self.build.catalog) if self.packages else {}
        return [catalog[name.lower()].source for name in self.packages] + list(self.sources)


def load_suite_config(path: str | Path) -> SuiteConfig:
    """The definition in TOML file `path`, with build.catalog and relative DIR sources resolved
    against its folder; a UserError naming the file, the field, the value and what was expected."""
    from carl.config import load_config
    from carl.tasks.build import check_sources
    from carl.tasks.catalog import read_catalog

    path = Path(path)
    if not path.is_file():
        raise UserError(f"suite {str(path)!r} does not exist; expected a suite definition (TOML, docs/bench.md)")
    try:
        cfg = load_config(SuiteConfig, path)
    except ValueError as e:  # ConfigError, or a nested config's own check (BuildConfig's)
        raise UserError(f"suite {path}: {e}") from None
    base = path.resolve().parent
    catalog = str(base / cfg.build.catalog) if cfg.build.catalog else None
    cfg = dataclasses.replace(cfg, build=dataclasses.replace(cfg.build, catalog=catalog),
                              sources=tuple(resolve_source(s, base) for s in cfg.sources))
    if cfg.packages:
        entries = read_catalog(catalog)
        for i, name in enumerate(cfg.packages):
            if name.lower() not in entries:
                raise UserError(f"suite {path}: packages[{i}]: {name!r} is not in the catalog {catalog}; expected "
                                f"one of {sorted(e.name for e in entries.values())}")
            if not entries[name.lower()].version:
                raise UserError(f"suite {path}: packages[{i}]: the catalog entry of {name!r} has no version; "
                                "expected version and sdist_sha256 (a suite pins its packages)")
    check_sources(list(cfg.sources))
    return cfg


def _source_name(spec: str) -> str:
    """The package name of a SOURCE as the pipeline names it (a PyPI name, a directory's name)."""
    if spec.startswith("pypi:"):
        return spec[5:].partition("==")[0]
    return Path(spec.rpartition("@")[0] if "@" in spec else spec).resolve().name


def resolve_source(spec: str, base: Path) -> str:
    """A relative DIR or DIR@REV made absolute against the suite file's folder; pypi: as it is."""
    if spec.startswith("pypi:"):
        return spec
    path, at, rev = spec.rpartition("@") if "@" in spec else (spec, "", "")
    return str((base / path).resolve()) + at + rev


# ------------------------------------------------------------------------------ selection


def select_tasks(tasks: list[TaskRecord], config: SuiteConfig) -> list[TaskRecord]:
    """The suite's tasks from one package's built ones (`config.select`), in selection order."""
    ordered = sorted(tasks, key=lambda t: t.instance_id)
    cap = config.cap(ordered[0].repo) if ordered else 0
    if config.select.rule == "by_id":
        return ordered[:cap]
    cells: dict[tuple[int, str], list[TaskRecord]] = {}
    for t in ordered:
        cells.setdefault((DELETION_KINDS.index(t.deletion_kind), bucket(t.size_lines, config.strata.size_lines)),
                         []).append(t)
    queues = [cells[k] for k in sorted(cells)]
    out: list[TaskRecord] = []
    while len(out) < cap and any(queues):
        for q in queues:
            if q and len(out) < cap:
                out.append(q.pop(0))
    return out


def smoke_tasks(tasks: list[TaskRecord], config: SuiteConfig) -> list[TaskRecord]:
    """The smoke subset of one package's suite tasks: the `smoke.per_package` smallest."""
    key = lambda t: (t.size_lines, t.size_files, len(t.FAIL_TO_PASS), t.instance_id)  # noqa: E731
    return sorted(tasks, key=key)[: config.smoke.per_package]


# ------------------------------------------------------------------------------ a built suite


SMOKE_ONLY_MARK = "smoke-only"
"""A file in a suite directory built with `carl bench build --smoke-only`: its pool and files hold the
lock's smoke subset alone."""


@dataclass(frozen=True)
class Suite:
    """A built suite directory, as `carl bench run` / `grade` use it."""

    dir: Path
    name: str
    config: SuiteConfig
    tasks: list[TaskRecord]
    """tasks.jsonl, or smoke.jsonl for the smoke subset."""
    smoke: bool
    lock_sha256: str
    """sha256 of suite.lock.json: two results with the same one scored the same tasks."""


def open_suite(directory: str | Path, smoke: bool = False) -> Suite:
    """The suite built into `directory` (its tasks, or its smoke subset); UserError when it is not one."""
    import hashlib

    from carl.tasks import load_tasks

    d = Path(directory)
    lock = d / "suite.lock.json"
    if not lock.is_file() or not (d / "suite.toml").is_file():
        raise UserError(f"--suite: {str(d)!r} is not a built suite (expected suite.toml and suite.lock.json in it); "
                        "build one with `carl bench build SUITE.toml --out DIR`")
    config = load_suite_config(d / "suite.toml")
    tasks_file = d / ("smoke.jsonl" if smoke else "tasks.jsonl")
    if not smoke and (d / SMOKE_ONLY_MARK).is_file():
        raise UserError(f"--suite: {str(d)!r} holds only its smoke subset (built with `carl bench build "
                        "--smoke-only`): pass --smoke, or build the whole suite into another directory")
    tasks = load_tasks(tasks_file, require_repos=True) if tasks_file.is_file() else []
    if not tasks:
        what = "smoke subset (smoke.per_package is 0?)" if smoke else "tasks"
        raise UserError(f"--suite: {str(d)!r} has no {what}: {tasks_file} is missing or empty")
    return Suite(d, config.name, config, tasks, smoke, hashlib.sha256(lock.read_bytes()).hexdigest())
