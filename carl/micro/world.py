"""Micro-world tasks: generated repositories turned into tasks by the real pipeline.

    generate_repo(seed) x N  --carl.tasks.build.build_repo (same sandboxes, validation, scrub)-->
        <dir>/warm_start.jsonl   tasks whose expert episodes are the warm-start data
        <dir>/rl.jsonl           tasks RL trains on (disjoint from the warm start's: its groups are
                                 not all-solved by a memorized answer, so they carry a signal)
        <dir>/eval.jsonl         tasks from held-out repos (never trained on)

No shortcut for the micro world: the repositories are ordinary Python packages with pytest
suites, so every task is validated exactly like one from a real repository. Building is
resumable (the pipeline's append-only output and finished-repo record), so a restarted run
reuses what it built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from carl.errors import UserError
from carl.micro.generate import generate_repo
from carl.tasks import TaskRecord, load_tasks, write_tasks
from carl.tasks.build import BuildConfig, build_repo, finished_specs, record_finished

SPLITS = ("warm_start", "rl", "eval")
"""Warm-start (expert data) repos, RL repos, held-out repos: three disjoint sets of generator seeds."""
EVAL_SEED_OFFSET = 100_000  # held-out repos use seeds >= this; training repos use seeds below it
RL_SEED_OFFSET = 500  # within a world's block of 1000 training seeds, RL repos start here


def split_seeds(split: str, seed: int, num_repos: int) -> list[int]:
    """Generator seeds of a split's repos: disjoint across splits and across worlds (seed)."""
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}, expected one of {SPLITS}")
    if not 0 <= num_repos <= RL_SEED_OFFSET:
        raise ValueError(f"{split} repos: got {num_repos}, expected 0..{RL_SEED_OFFSET}")
    base = {"warm_start": seed * 1000, "rl": seed * 1000 + RL_SEED_OFFSET, "eval": EVAL_SEED_OFFSET + seed * 1000}
    return [base[split] + i for i in range(num_repos)]


def build_micro_tasks(out_dir: str | Path, seed: int, difficulty: int, repos: Mapping[str, int],
                      modules_per_repo: int = 2, defs_per_module: int = 3, max_tasks_per_repo: int = 4,
                      backend: str = "bwrap", progress=None, jobs: int = 0,
                      templates: Mapping[str, Sequence[str]] | None = None,
                      gold_run: bool = False) -> dict[str, list[TaskRecord]]:
    """Generate each split's repos and build their tasks (stub-mode function and method deletions).

    `repos` maps a split ("warm_start", "rl", "eval") to its number of repos; returns the tasks of
    each split, sorted by id, also written to <out_dir>/<split>.jsonl. `progress(split, seed, result)`
    is called for each repo as it is ready: its build result, or None for a repo built before.
    `jobs` repos are built at once (0: one per 2 cores, at least 2; each validates its candidates on
    2 sandboxes): a repo's baseline suite runs are one process each, so a second repo keeps the other
    core busy meanwhile (the default world on 2 cores: 78-85 s with 1 job, 57-59 s with 2). Which
    tasks a repo yields does not depend on it (each repo takes its first valid candidates in plan
    order), so the world is the same for any `jobs`.

    `templates` maps a split to the templates a run keeps of it (`keep_templates`): that split's
    repos validate only those templates' candidates, and the others take their places in the repo's
    quota unvalidated (`build_repo`'s `unused`), so the split holds the tasks `keep_templates` would
    cut from a full build (every micro candidate validates: 216 of 216 in the default's world) for
    the validation runs of its tasks alone: the default's RL and held-out repos validate 31 tasks
    instead of 120.

    `gold_run` (BuildConfig.gold_run) runs each task's tests a third time with the gold patch
    applied. Off here: a micro repo is generated code whose suite passed twice in the baseline
    runs, and the build checks that broken + gold is byte for byte the original (a real repo's
    flaky or environment-dependent tests are what that run is for). The same tasks either way.
    """
    if jobs < 0:
        raise ValueError(f"jobs: got {jobs}, expected >= 0 (0: one per 2 cores, at least 2)")
    jobs = jobs or max(2, (os.cpu_count() or 2) // 2)
    templates = templates or {}
    out = Path(out_dir)
    cfg = BuildConfig(max_per_repo=max_tasks_per_repo, modes=("stub",), kinds=("function", "method"),
                      seed=seed, backend=backend, task_timeout_s=60.0, suite_timeout_s=120.0, gold_run=gold_run)
    todo: list[tuple[str, int]] = []
    for split, num_repos in repos.items():
        done = finished_specs(out / f"{split}.jsonl")
        for s in split_seeds(split, seed, num_repos):
            if str(out / "repos" / split / f"repo{s}") not in done:
                todo.append((split, s))
            elif progress is not None:
                progress(split, s, None)

    def build_one(split: str, s: int) -> None:
        tasks_path, repo_dir = out / f"{split}.jsonl", out / "repos" / split / f"repo{s}"
        if not repo_dir.exists():
            generate_repo(repo_dir, seed=s, difficulty=difficulty, num_modules=modules_per_repo,
                          defs_per_module=defs_per_module)
        kept = templates.get(split)
        result = build_repo(str(repo_dir), tasks_path, cfg,
                            unused=(lambda cand: symbol_template(cand.symbols[0]) not in kept) if kept else None)
        record_finished(tasks_path, result)
        if result.status == "failed":
            raise RuntimeError(f"micro repo {repo_dir} gave no tasks: {result.error}")
        if progress is not None:
            progress(split, s, result)

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="micro-repo")
    try:
        for fut in as_completed([pool.submit(build_one, split, s) for split, s in todo]):
            fut.result()
    finally:  # on a failed repo or Ctrl-C: start no other repo, let the running ones finish their line
        pool.shutdown(wait=True, cancel_futures=True)
    world: dict[str, list[TaskRecord]] = {}
    for split, num_repos in repos.items():
        tasks_path = out / f"{split}.jsonl"
        # sorted: repos and their validations append tasks in completion order, the world must not depend on it
        world[split] = sorted(load_tasks(tasks_path) if tasks_path.exists() else [], key=lambda t: t.instance_id)
        if num_repos and not world[split] and templates.get(split):
            raise UserError(f"micro.templates: {list(templates[split])} match no {split} task of the {num_repos} "
                            f"{split} repos of this world (more micro.{split}_repos may bring them; "
                            "micro.templates=[] keeps every template)")
        if num_repos and not world[split]:
            raise RuntimeError(f"micro world built no {split} tasks from {num_repos} repos "
                               f"(see the drop reasons in {out / (split + '.store')})")
    return world


def template(task: TaskRecord) -> str:
    """A micro task's template: its deleted function's name without the noun ("pkg.mod:shift_price" -> shift,
    "pkg.mod:Meter.reset_total" -> reset)."""
    return symbol_template(task.deleted_symbols[0])


def symbol_template(symbol: str) -> str:
    """The template of a deleted symbol ("pkg.mod:shift_price" -> shift)."""
    return re.split(r"[.:]", symbol)[-1].rsplit("_", 1)[0]


def templates_file(out_dir: str | Path, split: str) -> Path:
    """Where `keep_templates` writes a split's cut: <out_dir>/<split>.templates.jsonl."""
    return Path(out_dir) / f"{split}.templates.jsonl"


def keep_templates(world: Mapping[str, list[TaskRecord]], templates: Sequence[str], out_dir: str | Path,
                   splits: Sequence[str] = ("rl", "eval")) -> dict[str, list[TaskRecord]]:
    """`world` with its `splits` cut to the tasks of `templates`; each cut split is also written to
    <out_dir>/<split>.templates.jsonl (what a branch of the run trains and evaluates on). Raises
    ValueError naming a template that no task of a split has, with the templates the split does have."""
    out = dict(world)
    for split in splits:
        have = sorted({template(t) for t in world[split]})
        missing = [name for name in templates if name not in have]
        if missing:
            raise ValueError(f"micro.templates: {missing} match no {split} task of this world; its {split} tasks' "
                             f"templates are {have} (more micro.{split}_repos may bring more templates)")
        out[split] = [t for t in world[split] if template(t) in templates]
        write_tasks(templates_file(out_dir, split), out[split])
    return out
