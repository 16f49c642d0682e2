"""The task pipeline for one repository, and the resumable batch over many.

    build_repo(SOURCE):
      fetch (dir | path@rev | pypi sdist) -> scrub -> layout -> prepared venv (cached)
      -> baseline in a sandbox: suite run 1 (timings, imports), run 2 (traced: test -> definitions)
         keep tests that passed both times
      -> candidates (function, method, class, module, cluster) x modes, interleaved by seed
      -> validate each until max_per_repo tasks: append TaskRecord or count a drop reason
      -> append the repo's outcome to <store>/repos.jsonl (a rerun skips it)

One bad repository (no tests, failing or hanging suite, pip failure, not Python) becomes a
failed RepoResult; the batch goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from carl.errors import UserError
from carl.io import append_jsonl, read_jsonl
from carl.sandbox.base import Sandbox, SandboxConfig
from carl.tasks.audit import TEXT_SUFFIXES, installed_copies, normalise, text_index
from carl.tasks.candidates import all_definitions, find_candidates, invert_test_map, plan
from carl.tasks.catalog import CatalogEntry, read_catalog
from carl.tasks.delete import Candidate
from carl.tasks.environment import (
    PURE_PYTHON_ENV,
    dist_name,
    prepare_env,
    python_version,
    repo_requirements,
    site_packages,
)
from carl.tasks.layout import detect_layout
from carl.tasks.record import DELETION_KINDS, DELETION_MODES
from carl.tasks.scrub import scrub_tree
from carl.tasks.sources import fetch_source, parse_source, tree_hash
from carl.tasks.store import append_task, store_dir
from carl.tasks.suite import run_suite
from carl.tasks.validate import Drop, RepoContext, instance_id, validate_candidate

DEFAULT_PYTEST = ("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no")
_VALUE_OPTIONS = {
    "-p",
    "-o",
    "-k",
    "-m",
    "-c",
    "--deselect",
    "--ignore",
    "--rootdir",
    "--tb",
    "--confcutdir",
    "--ignore-glob",
    "--override-ini",
    "-W",
}


@dataclass(frozen=True)
class BuildConfig:
    max_per_repo: int = 50
    """Stop a repo after this many validated tasks."""
    max_attempts_per_repo: int = 0
    """Stop a repo after this many (candidate, mode) tries; 0 means 4 x max_per_repo."""
    workers: int = 2
    """Candidates validated at once, each worker with its own sandbox and scratch copy. A task's
    runs are single-threaded pytest processes, so 2 workers use both cores of a small machine."""
    modes: tuple[str, ...] = DELETION_MODES
    """Deletion modes to make tasks in."""
    kinds: tuple[str, ...] = DELETION_KINDS
    """Candidate kinds to make tasks from."""
    seed: int = 0
    """Order in which candidates are tried."""
    backend: str = "bwrap"
    """Sandbox backend for every test run ("bwrap", or "local" for development)."""
    suite_timeout_s: float = 900.0
    """Limit of one baseline run of the whole suite."""
    task_timeout_s: float = 120.0
    """Upper limit of one validation run of a task's selected tests."""
    slow_factor: float = 5.0
    """A validation run may take at most this many times the baseline run of the whole suite
    (and at least min_task_timeout_s); a slower one drops the task as "timeout". A deletion that
    turns failures into waits (threads blocking until their timeouts) makes tasks whose every
    reward costs minutes."""
    min_task_timeout_s: float = 10.0
    """Floor of the per-run limit that slow_factor sets."""
    gold_run: bool = True
    """Run the selected tests once more with the gold patch applied (else trust that broken +
    gold is byte-identical to the original, which passed them twice)."""
    python_env: str | None = None
    """Use this existing venv for every repo instead of preparing one (it must not contain the
    packages under test)."""
    audit_env: bool = True
    """Also search the environment's site-packages for deleted source (off only for tests that
    borrow a huge venv)."""
    catalog: str | None = None
    """A catalog (carl.tasks.catalog, docs/tasks.md): per package name its test_deps,
    test_command and env."""

    def __post_init__(self) -> None:
        if self.max_per_repo <= 0:
            raise ValueError(f"max_per_repo: got {self.max_per_repo}, expected a positive number")
        if self.max_attempts_per_repo < 0:
            raise ValueError(f"max_attempts_per_repo: got {self.max_attempts_per_repo}, expected >= 0")
        for m in self.modes:
            if m not in DELETION_MODES:
                raise ValueError(f"modes: got {m!r}, expected a subset of {DELETION_MODES}")
        if self.workers < 1:
            raise ValueError(f"workers: got {self.workers}, expected >= 1")
        for k in self.kinds:
            if k not in DELETION_KINDS:
                raise ValueError(f"kinds: got {k!r}, expected a subset of {DELETION_KINDS}")
        if self.slow_factor <= 0 or self.min_task_timeout_s <= 0:
            raise ValueError("slow_factor / min_task_timeout_s: expected positive numbers")
        if self.suite_timeout_s <= 0 or self.task_timeout_s <= 0:
            raise ValueError("suite_timeout_s / task_timeout_s: expected positive seconds")


@dataclass
class RepoResult:
    spec: str
    name: str = ""
    status: str = "ok"
    """"ok", "skipped" (finished in an earlier run) or "failed"."""
    error: str = ""
    n_tasks: int = 0
    n_attempts: int = 0
    n_unused: int = 0
    """Candidates the caller said it would not use (`build_repo`'s `unused`): each took its place in
    the repo's quota unvalidated."""
    drops: Counter = field(default_factory=Counter)
    n_tests: int = 0
    """Tests kept for tasks (passed twice)."""
    n_flaky_or_failing: int = 0
    n_candidates: int = 0
    wall_s: float = 0.0
    suite_s: float = 0.0
    """Wall time of the plain baseline run of the whole suite."""
    trace_s: float = 0.0
    """Wall time of the traced baseline run (its ratio to suite_s is the cost of the test map)."""
    task_test_s: list[float] = field(default_factory=list)
    """Per validated task: the summed call time of its own FAIL_TO_PASS + PASS_TO_PASS tests."""
    validate_s: float = 0.0
    """Wall time of validating candidates (all workers, drops included): the throughput cost."""
    task_wall_s: list[float] = field(default_factory=list)
    """Per validated task: wall time spent validating it (runs, copy, audit)."""
    task_runs_s: list[list[float]] = field(default_factory=list)
    """Per validated task: wall time of each test run (broken, broken again[, gold])."""
    n_failing_tests: int = 0
    """Distinct FAIL_TO_PASS test ids across the repo's tasks."""
    drop_details: dict[str, str] = field(default_factory=dict)
    """Drop reason -> the detail of its first drop that had one (where a leak was found)."""
    warning: str = ""
    """Set when the tasks look weak as a whole (`few_tests_warning`)."""

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items()}
        d["drops"] = dict(self.drops)
        return d


FEW_TESTS_MIN_TASKS = 6
TASKS_PER_FAILING_TEST = 3


def few_tests_warning(n_tasks: int, n_failing_tests: int) -> str:
    """A warning when many tasks rest on very few tests, else "".

    A task is graded by its FAIL_TO_PASS tests. When a repo's tasks (at least
    FEW_TESTS_MIN_TASKS) draw on fewer than one distinct failing test per TASKS_PER_FAILING_TEST
    tasks, the same few coarse checks grade them all (a package whose only tests were two
    doctests gave 30 tasks): a reward says little about the deleted feature, and the tasks are
    near-duplicates as training signal. Under the threshold a task has, on average, tests of
    its own.
    """
    if n_tasks < FEW_TESTS_MIN_TASKS or n_failing_tests * TASKS_PER_FAILING_TEST >= n_tasks:
        return ""
    return (f"few tests: {n_tasks} tasks rest on {n_failing_tests} distinct failing test"
            f"{'s' if n_failing_tests != 1 else ''} ({n_tasks / max(n_failing_tests, 1):.0f} tasks a test); "
            "they grade the deleted features only coarsely (more tests, or a lower --max-per-repo)")


SandboxFactory = Callable[[Path, SandboxConfig], Sandbox]


def default_open_sandbox(source: Path, cfg: SandboxConfig) -> Sandbox:
    from carl.sandbox import open_sandbox

    return open_sandbox(source, cfg)


def build_repo(
    spec: str,
    out: Path,
    cfg: BuildConfig,
    open_sandbox: SandboxFactory = default_open_sandbox,
    on_task: Callable[[RepoResult], None] | None = None,
    only: frozenset[str] | None = None,
    unused: Callable[[Candidate], bool] | None = None,
) -> RepoResult:
    """Build tasks from one source into `out` (append-only); never raises for a bad repo.
    `only`: validate just the candidates with these instance ids (a suite's smoke subset from its
    lock), skipping the others unvalidated and uncounted. `unused`: candidates the caller would
    throw away (the micro world's other templates); each takes its place in the repo's quota
    (`max_per_repo`) unvalidated and unwritten, as if it had validated, so the tasks written are
    those of a full build that the caller keeps, whenever the unused candidates would validate."""
    result = RepoResult(spec)
    t0 = time.perf_counter()
    store = store_dir(out)
    tmp = store / "tmp" / uuid.uuid4().hex[:12]
    try:
        _build(spec, out, cfg, open_sandbox, result, store, tmp, on_task, only, unused)
    except UserError:
        raise  # a malformed SOURCE is the user's mistake: say so, do not record it
    except Exception as e:  # noqa: BLE001 -- a bad repository becomes data, the batch goes on
        result.status = "failed"
        result.error = f"{type(e).__name__}: {e}"[:1000]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.wall_s = time.perf_counter() - t0
    return result


def _build(
    spec: str,
    out: Path,
    cfg: BuildConfig,
    open_sandbox: SandboxFactory,
    result: RepoResult,
    store: Path,
    tmp: Path,
    on_task,
    only: frozenset[str] | None = None,
    unused: Callable[[Candidate], bool] | None = None,
) -> None:
    source, original, source_hash, layout = _fetch_original(spec, store, tmp)
    result.name = source.name
    entry = read_catalog(cfg.catalog).get(source.name.lower()) if cfg.catalog else None
    entry = entry or CatalogEntry(source.name)
    options, targets = split_test_command(entry.test_command or shlex.join(DEFAULT_PYTEST))
    test_command = (
        *options,
        "--tb=short",
        *(("-o", f"pythonpath={' '.join(layout.pythonpath)}") if layout.pythonpath else ()),
    )
    environment = _environment(original, layout, source.name, entry, cfg)
    env_path = Path(environment["path"])
    sandbox_cfg = SandboxConfig(
        backend=cfg.backend,
        timeout_s=cfg.task_timeout_s,
        python_env=str(env_path),
        env={
            **environment["env"],
            **({"PYTHONPATH": ":".join([*layout.pythonpath, "."])} if layout.pythonpath else {}),
        },
    )
    modules = tuple(
        m for m in (layout.module_name(f) for f in layout.source_files) if not m.endswith("__main__")
    )
    shutil.copytree(original, tmp / "scratch", symlinks=True)
    with closing(open_sandbox(original, sandbox_cfg)) as sb:
        # Baseline: the whole suite twice; the second run traces which definitions each test runs.
        run1 = run_suite(
            sb,
            test_command,
            targets,
            timeout_s=cfg.suite_timeout_s,
            pythonpath=layout.pythonpath,
            imports=modules,
        )
        if not run1.completed:
            raise RepoFailure(
                ("suite timed out" if run1.timed_out else "suite did not run")
                + f": {run1.output_tail[-400:]}"
            )
        run2 = run_suite(
            sb,
            test_command,
            targets,
            timeout_s=cfg.suite_timeout_s * 3,
            trace=True,
            pythonpath=layout.pythonpath,
        )
        if not run2.completed:
            raise RepoFailure("traced suite run did not finish")
        result.suite_s, result.trace_s = run1.wall_s, run2.wall_s
        selected = {t for t in run1.outcomes if run1.passed(t) and run2.passed(t)}
        result.n_tests = len(selected)
        result.n_flaky_or_failing = sum(
            1 for t, o in run1.outcomes.items() if o != "skipped" and t not in selected
        )
        if not selected:
            missing = missing_module(run1.output_tail)
            if missing:
                raise RepoFailure(f"no test passed twice: the tests import {missing!r}, which the environment lacks; "
                                  "declare it in the package's dependencies or in the catalog entry's test_deps "
                                  f"(installed: {', '.join(environment['requirements']) or 'none'})")
            raise RepoFailure(f"no test passed twice: {run1.output_tail[-400:]}")

        tests_of = invert_test_map(run2.coverage, selected)
        candidates = find_candidates(all_definitions(original, layout), tests_of, frozenset(run2.import_time))
        result.n_candidates = len(candidates)
        ctx = RepoContext(
            name=source.name,
            version=source.version,
            base_commit=source.base_commit,
            source_hash=source_hash,
            original=original,
            layout=layout,
            test_command=test_command,
            environment=environment,
            sandbox_config=sandbox_cfg,
            tests_of=tests_of,
            timings=run1.durations,
            imports=tuple(m for m in modules if m not in run1.import_errors),
            env_index=_env_index(env_path) if cfg.audit_env else "",
            workspace_index=_workspace_index(original),
            sandbox=sb,
            scratch=tmp / "scratch",
            tasks_path=out,
            broken_root=store / "broken",
            timeout_s=min(cfg.task_timeout_s, max(cfg.min_task_timeout_s, cfg.slow_factor * run1.wall_s)),
            gold_run=cfg.gold_run,
        )
        with contextlib.ExitStack() as stack:
            workers = [ctx]
            for w in range(1, cfg.workers):  # more sandboxes + scratch copies over the same original
                scratch = tmp / f"scratch{w}"
                shutil.copytree(original, scratch, symlinks=True)
                wsb = stack.enter_context(closing(open_sandbox(original, sandbox_cfg)))
                workers.append(dataclasses.replace(ctx, sandbox=wsb, scratch=scratch, stats={}))
            t_validate = time.perf_counter()
            failing = _make_tasks(workers, candidates, out, cfg, result, store, on_task, only, unused)
            result.validate_s = time.perf_counter() - t_validate
    result.n_failing_tests = len(failing)
    result.warning = few_tests_warning(result.n_tasks, result.n_failing_tests)


def _fetch_original(spec: str, store: Path, tmp: Path):
    """Fetch and scrub the source; keep it as the store's original tree (named by its hash)."""
    source = fetch_source(spec, tmp / "src", store / "downloads")
    scrub_tree(tmp / "src")
    layout = detect_layout(tmp / "src")
    if not layout.source_files:
        raise RepoFailure("no Python package found (expected a directory with __init__.py, or src/<pkg>)")
    source_hash = tree_hash(tmp / "src")
    original = store / "originals" / source_hash[:16]
    if not original.is_dir():
        original.parent.mkdir(parents=True, exist_ok=True)
        (tmp / "src").rename(original)
    return source, original, source_hash, layout


def _environment(original: Path, layout, name: str, entry: CatalogEntry, cfg: BuildConfig) -> dict:
    """TaskRecord.environment: the prepared venv (never holding the package under test) and env vars."""
    requirements = repo_requirements(original, list(entry.test_deps))
    exclude = sorted({name, dist_name(original) or name})
    env_path = Path(cfg.python_env) if cfg.python_env else prepare_env(requirements, exclude=exclude)
    installed = installed_copies(site_packages(env_path), layout.packages)
    if installed:
        raise RepoFailure(f"the environment has an installed copy of {installed}: deleted code would leak")
    return {
        "python": python_version(),
        "requirements": requirements,
        "exclude": exclude,
        "path": str(env_path),
        "env": {**PURE_PYTHON_ENV, **entry.env},
        "pythonpath": list(layout.pythonpath),
    }


def _make_tasks(
    workers: list[RepoContext], candidates, out: Path, cfg: BuildConfig, result: RepoResult, store: Path, on_task,
    only: frozenset[str] | None = None,
    unused: Callable[[Candidate], bool] | None = None,
) -> set[str]:
    """Validate candidates in plan order on the worker contexts (one candidate per worker at a time);
    the FAIL_TO_PASS test ids of the repo's tasks (those of an earlier run included).

    Results are recorded here, in the calling thread, in completion order; a repo stops taking
    new candidates once validated + in-flight tasks reach max_per_repo or the attempts run out.
    """
    ctx = workers[0]
    done = _existing_tasks(out)
    failing: set[str] = set()
    max_attempts = cfg.max_attempts_per_repo or 4 * cfg.max_per_repo
    todo = iter(plan(candidates, list(cfg.modes), list(cfg.kinds), cfg.seed))
    free = list(workers)
    running: dict[Future, tuple[RepoContext, object, str, float]] = {}

    def submit_next() -> bool:
        for cand, mode in todo:
            if result.n_tasks + result.n_unused + len(running) >= cfg.max_per_repo or result.n_attempts >= max_attempts:
                return False
            iid = instance_id(ctx, cand, mode)
            if only is not None and iid not in only:
                continue
            if iid in done:  # made by an interrupted earlier run
                result.n_tasks += 1
                failing.update(done[iid])
                continue
            if unused is not None and unused(cand):
                result.n_unused += 1
                continue
            result.n_attempts += 1
            w = free.pop()
            running[pool.submit(validate_candidate, w, cand, mode)] = (w, cand, mode, time.perf_counter())
            return True
        return False

    with ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="validate") as pool:
        while free and submit_next():
            pass
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                w, cand, mode, t_task = running.pop(fut)
                task = fut.result()
                if isinstance(task, Drop):
                    result.drops[task.reason] += 1
                    if task.detail:
                        result.drop_details.setdefault(task.reason, task.detail)
                    append_jsonl(
                        store / "drops.jsonl",
                        {"repo": ctx.name, "candidate": cand.name, "kind": cand.kind, "mode": mode,
                         "reason": task.reason, **({"detail": task.detail} if task.detail else {})},
                    )
                else:
                    append_task(out, task)
                    result.n_tasks += 1
                    failing.update(task.FAIL_TO_PASS)
                    result.task_wall_s.append(time.perf_counter() - t_task)
                    result.task_test_s.append(sum(task.test_timings.values()))
                    result.task_runs_s.append(w.stats.pop("runs_s"))
                free.append(w)
                if on_task:
                    on_task(result)
            while free and submit_next():
                pass
    return failing


class RepoFailure(RuntimeError):
    """This repository cannot give tasks (reported in the summary, never stops the batch)."""


def split_test_command(command: str) -> tuple[tuple[str, ...], list[str]]:
    """`python -m pytest OPTIONS... PATHS...` -> (argv prefix with options, test paths)."""
    argv = shlex.split(command)
    if argv[:3] != ["python", "-m", "pytest"]:
        raise UserError(f"test_command: got {command!r}, expected 'python -m pytest ...'")
    options, targets = list(argv[:3]), []
    rest = argv[3:]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in _VALUE_OPTIONS and i + 1 < len(rest):
            options += [a, rest[i + 1]]
            i += 2
            continue
        (options if a.startswith("-") else targets).append(a)
        i += 1
    return tuple(options), targets


def finished_specs(out: Path) -> set[str]:
    """Sources a rerun skips: those whose last build wrote tasks or finished. A source whose last
    build failed before writing any task is tried again (the user may have fixed the cause)."""
    path = store_dir(out) / "repos.jsonl"
    last = {d["spec"]: d for d in read_jsonl(path)} if path.is_file() else {}
    return {spec for spec, d in last.items() if d.get("status") != "failed" or d.get("n_tasks", 0) > 0}


def record_finished(out: Path, result: RepoResult) -> None:
    append_jsonl(store_dir(out) / "repos.jsonl", result.to_dict())


def check_sources(specs: list[str]) -> None:
    """Fail early, before any work, on a malformed SOURCE."""
    for spec in specs:
        parse_source(spec)


_ENV_INDEX: dict[str, str] = {}


def _env_index(env: Path) -> str:
    key = str(env)
    if key not in _ENV_INDEX:
        _ENV_INDEX[key] = text_index(site_packages(env), {".py"})
    return _ENV_INDEX[key]


def _workspace_index(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.suffix in TEXT_SUFFIXES:
            try:
                out[str(p.relative_to(root))] = normalise(p.read_text())
            except (UnicodeDecodeError, OSError):
                continue
    return out


def _existing_tasks(out: Path) -> dict[str, list[str]]:
    """instance_id -> FAIL_TO_PASS of the tasks already in the task file."""
    return {d["instance_id"]: d.get("FAIL_TO_PASS", []) for d in read_jsonl(out)} if out.is_file() else {}


def missing_module(output: str) -> str | None:
    """The module a test run failed to import ("No module named 'x'"), or None."""
    import re

    m = re.search(r"No module named '([^']+)'", output)
    return m.group(1) if m else None
