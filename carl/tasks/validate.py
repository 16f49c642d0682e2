"""Turn one (candidate, mode) into a validated TaskRecord, or a counted drop reason.

    delete the feature in a scratch copy -> gold patch exact? -> audit clean?
        -> the repo's sandbox (holds the original): write the changed files in
             run 1: package imports?  >= 1 test fails (FAIL_TO_PASS)?  the rest pass (PASS_TO_PASS)?
             run 2: the same outcomes?
           write the original files back (this IS the gold patch applied)
             gold:  every selected test passes?
        -> save the broken repo in the store -> problem statement -> TaskRecord
    (the scratch copy is reverted whatever happened)

One sandbox serves all tasks of a repo: a task costs its own test runs, not a copy of the repo
and a sandbox start. Every run is a fresh interpreter with PYTHONDONTWRITEBYTECODE, so no
bytecode of a broken version survives; files a test suite itself writes into the workspace do
carry over (the gold run, and the clean sandbox of every reward, would show their effect).

Only the tests that can be affected run: those the per-test map says execute a deleted
definition or anything in a file the deletion changed. A test outside that set executes none
of the changed code, and the package still imports (checked in run 1, every module the original
imported), so its outcome cannot change.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from carl.sandbox.base import Sandbox, SandboxConfig
from carl.tasks.audit import deleted_blocks, leak_problem, locate_block, normalise
from carl.tasks.delete import Candidate, DeletionError, apply_deletion
from carl.tasks.environment import site_packages
from carl.tasks.layout import Layout
from carl.tasks.patch import apply_patch, diff_stats, read_text, tree_diff
from carl.tasks.record import TaskRecord
from carl.tasks.scrub import find_leaks
from carl.tasks.statement import template_statement
from carl.tasks.store import relative_to_tasks_file
from carl.tasks.suite import SuiteRun, run_suite

DROP_REASONS = (
    "deletion_failed",  # nothing to delete in this mode, or the edit would not parse
    "gold_patch_mismatch",  # broken + gold patch != original (never expected; a bug guard)
    "leak",  # scrub/audit found the deleted code or a leaky artifact
    "import_broken",  # the broken package no longer imports
    "timeout",  # a run of the selected tests hit its time limit
    "crash",  # pytest did not finish (no report)
    "no_failing_test",  # the deletion made no selected test fail
    "nondeterministic",  # run 2 disagreed with run 1
    "gold_fails",  # with the gold patch applied a selected test still fails
)


@dataclass(frozen=True)
class Drop:
    """Why a (candidate, mode) gave no task."""

    reason: str
    """One of DROP_REASONS."""
    detail: str = ""
    """What was found, where one place is to blame: for "leak", the copies of deleted source
    with the file and line each was found at (the first three), or the leftover artifacts."""


@dataclass
class RepoContext:
    """Everything validation needs about one repo, computed once by carl.tasks.build."""

    name: str
    version: str
    base_commit: str
    source_hash: str
    original: Path
    """The scrubbed original tree (in the store)."""
    layout: Layout
    test_command: tuple[str, ...]
    environment: dict
    """TaskRecord.environment (path relative to the task file is fine; build writes absolute)."""
    sandbox_config: SandboxConfig
    tests_of: dict[str, frozenset[str]]
    """definition key -> selected tests that execute it."""
    timings: dict[str, float]
    imports: tuple[str, ...]
    """Modules the original imports; the broken repo must import all of them."""
    env_index: str
    """Normalised text of the environment's site-packages, for the audit."""
    workspace_index: dict[str, str]
    """repo-relative text file -> normalised text, of the original (for the audit)."""
    sandbox: Sandbox
    """One sandbox per repo over the original; each task writes its changed files in, runs, and
    writes the originals back (which is the gold patch applied)."""
    scratch: Path
    """A host copy of the original the deletion is applied to (and reverted after)."""
    tasks_path: Path
    broken_root: Path
    """Store directory for broken repos."""
    timeout_s: float = 300.0
    gold_run: bool = True
    stats: dict = field(default_factory=dict)
    """Measurements of the last validated task ("runs_s": wall time of each of its test runs)."""


def instance_id(ctx: RepoContext, cand: Candidate, mode: str) -> str:
    digest = hashlib.sha1(f"{cand.kind}|{cand.name}".encode()).hexdigest()[:8]
    version = ctx.version or ctx.source_hash[:8]
    return f"{ctx.name}__{version}-{cand.kind}-{mode}-{digest}"


def validate_candidate(ctx: RepoContext, cand: Candidate, mode: str) -> TaskRecord | Drop:
    """The validated task (its broken repo saved in the store), or why it was dropped."""
    iid = instance_id(ctx, cand, mode)
    try:
        changed = apply_deletion(ctx.scratch, cand, mode, ctx.layout)
    except DeletionError:
        return Drop("deletion_failed")
    try:
        return _validate(ctx, cand, mode, iid, changed)
    finally:
        _restore(ctx.scratch, ctx.original, changed)


def _validate(
    ctx: RepoContext, cand: Candidate, mode: str, iid: str, changed: list[str]
) -> TaskRecord | Drop:
    broken = ctx.scratch
    forward = tree_diff(ctx.original, broken, changed)
    gold = tree_diff(broken, ctx.original, changed)
    if not _gold_is_exact(broken, ctx.original, changed, gold):
        return Drop("gold_patch_mismatch")
    problems = _audit(ctx, broken, changed, forward)
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        return Drop("leak", "; ".join(problems[:3]) + more)

    selected = set(cand.tests)
    changed_set = set(changed)
    for key, tests in ctx.tests_of.items():
        if key.split("::")[0] in changed_set:
            selected |= tests
    targets = sorted(selected)
    deleted_modules = {ctx.layout.module_name(rel) for rel in changed if not (broken / rel).exists()}
    imports = tuple(m for m in ctx.imports if m not in deleted_modules)
    sb = ctx.sandbox
    _write_files(sb, broken, changed)  # the shared sandbox now holds the broken repo
    try:
        run1 = _run(ctx, sb, targets, imports)
        if run1.import_errors:
            return Drop("import_broken")
        if not run1.completed:
            return Drop("timeout" if run1.timed_out else "crash")
        fail = sorted(t for t in targets if not run1.passed(t))
        ok = sorted(t for t in targets if run1.passed(t))
        if not fail:
            return Drop("no_failing_test")
        run2 = _run(ctx, sb, targets, imports)
        drop = second_run_drop(run2, targets, fail)
        if drop is not None:
            return drop
    finally:
        _write_files(sb, ctx.original, changed)  # back to the original: the gold patch applied
    if ctx.gold_run:
        gold_run = _run(ctx, sb, targets, imports)
        if not gold_run.completed or any(not gold_run.passed(t) for t in targets):
            return Drop("gold_fails")

    ctx.stats["runs_s"] = [run1.wall_s, run2.wall_s] + ([gold_run.wall_s] if ctx.gold_run else [])
    stored = ctx.broken_root / iid
    shutil.rmtree(stored, ignore_errors=True)
    shutil.copytree(broken, stored, symlinks=True)
    n_files, _, n_removed = diff_stats(forward)
    return TaskRecord(
        instance_id=iid,
        repo=ctx.name,
        version=ctx.version,
        base_commit=ctx.base_commit or ctx.source_hash,
        patch=gold,
        test_patch="",
        FAIL_TO_PASS=tuple(fail),
        PASS_TO_PASS=tuple(ok),
        problem_statement=template_statement(ctx.original, cand, mode, fail, pass_to_pass=ok),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        deletion_mode=mode,
        deletion_kind=cand.kind,
        deleted_symbols=cand.symbols,
        size_lines=n_removed,
        size_files=n_files,
        source_hash=ctx.source_hash,
        test_command=ctx.test_command,
        test_files=ctx.layout.test_files,
        environment=ctx.environment,
        broken_repo=relative_to_tasks_file(stored, ctx.tasks_path),
        test_timings={t: round(ctx.timings.get(t, 0.0), 6) for t in targets},
    )


def _audit(ctx: RepoContext, broken: Path, changed: list[str], forward: str) -> list[str]:
    """audit_tree, with the original's normalised text reused for the files the deletion left alone."""
    files = dict(ctx.workspace_index)
    for rel in changed:
        files.pop(rel, None)
        if (broken / rel).exists():
            files[rel] = normalise(read_text(broken / rel))
    problems = [f"leftover artifact {rel}" for rel in find_leaks_in(broken, changed)]
    for block in deleted_blocks(forward):
        hits = [rel for rel, text in files.items() if block in text]
        if hits:
            problems.append(leak_problem("the workspace", locate_block(block, broken, hits), block))
        if ctx.env_index and block in ctx.env_index:  # rare: only then look for the file
            site = site_packages(Path(ctx.environment["path"]))
            rels = (str(p.relative_to(site)) for p in sorted(site.rglob("*.py")))
            location = locate_block(block, site, rels)
            problems.append(leak_problem("the environment", location and f"site-packages/{location}", block))
    return problems


def find_leaks_in(root: Path, changed: list[str]) -> list[str]:
    """Leaks a deletion could have added: only the changed files' directories can hold new ones."""
    out = []
    for d in sorted({(root / rel).parent for rel in changed}):
        if d.is_dir():
            out += [str((d / p).relative_to(root)) for p in find_leaks(d) if "/" not in p]
    return out


def _write_files(sb: Sandbox, src_root: Path, files: list[str]) -> None:
    """Make the sandbox's copy of `files` equal to src_root's (deleting what src_root lacks)."""
    gone = []
    for rel in files:
        if (src_root / rel).exists():
            sb.write_file(rel, (src_root / rel).read_bytes())
        else:
            gone.append(rel)
    if gone:
        sb.exec(["rm", "-f", "--", *gone])


def _restore(scratch: Path, original: Path, files: list[str]) -> None:
    for rel in files:
        if (original / rel).exists():
            shutil.copy2(original / rel, scratch / rel)
        else:
            (scratch / rel).unlink(missing_ok=True)


def second_run_drop(run2: SuiteRun, targets: list[str], fail: list[str]) -> Drop | None:
    """Why a candidate whose first run of the broken repo failed `fail` is dropped after its second
    run, or None. A second run that did not finish is a timeout or a crash, as a first one is (on a
    loaded machine it is the usual case, and calling it nondeterminism sent people to the tests)."""
    if not run2.completed:
        return Drop("timeout" if run2.timed_out else "crash", "the second run of the broken repo's tests")
    flipped = sorted(set(fail) ^ {t for t in targets if not run2.passed(t)})
    if flipped:
        return Drop("nondeterministic", f"{len(flipped)} selected tests changed outcome between two runs: "
                    + ", ".join(flipped[:3]) + (" ..." if len(flipped) > 3 else ""))
    return None


def _run(ctx: RepoContext, sb: Sandbox, targets: list[str], imports: tuple[str, ...]) -> SuiteRun:
    # Only outcomes matter here: no tracebacks (a failing run formats one per test, 3-10x slower).
    return run_suite(
        sb,
        (*ctx.test_command, "--tb=no"),
        targets,
        timeout_s=ctx.timeout_s,
        pythonpath=ctx.layout.pythonpath,
        imports=imports,
    )


def _gold_is_exact(broken: Path, original: Path, changed: list[str], gold: str) -> bool:
    """Apply the gold patch to a copy of the changed broken files; it must give the original bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        for rel in changed:
            if (broken / rel).exists():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(broken / rel, Path(tmp) / rel)
        apply_patch(Path(tmp), gold)
        for rel in changed:
            if not (Path(tmp) / rel).exists() or read_text(Path(tmp) / rel) != read_text(original / rel):
                return False
    return True
