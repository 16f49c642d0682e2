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

from collections.abc import Mapping
from pathlib import Path

from carl.micro.generate import generate_repo
from carl.tasks import TaskRecord, load_tasks
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
                      backend: str = "bwrap", progress=None) -> dict[str, list[TaskRecord]]:
    """Generate each split's repos and build their tasks (stub-mode function and method deletions).

    `repos` maps a split ("warm_start", "rl", "eval") to its number of repos; returns the tasks of
    each split, sorted by id, also written to <out_dir>/<split>.jsonl. `progress(split, seed, result)`
    is called for each repo as it is ready: its build result, or None for a repo built before.
    """
    out = Path(out_dir)
    cfg = BuildConfig(max_per_repo=max_tasks_per_repo, modes=("stub",), kinds=("function", "method"),
                      seed=seed, backend=backend, task_timeout_s=60.0, suite_timeout_s=120.0)
    world: dict[str, list[TaskRecord]] = {}
    for split, num_repos in repos.items():
        tasks_path = out / f"{split}.jsonl"
        done = finished_specs(tasks_path)
        for s in split_seeds(split, seed, num_repos):
            repo_dir = out / "repos" / split / f"repo{s}"
            if str(repo_dir) in done:
                if progress is not None:
                    progress(split, s, None)
                continue
            if not repo_dir.exists():
                generate_repo(repo_dir, seed=s, difficulty=difficulty, num_modules=modules_per_repo,
                              defs_per_module=defs_per_module)
            result = build_repo(str(repo_dir), tasks_path, cfg)
            record_finished(tasks_path, result)
            if result.status == "failed":
                raise RuntimeError(f"micro repo {repo_dir} gave no tasks: {result.error}")
            if progress is not None:
                progress(split, s, result)
        # sorted: parallel validation appends tasks in completion order, the world must not depend on it
        world[split] = sorted(load_tasks(tasks_path) if tasks_path.exists() else [], key=lambda t: t.instance_id)
        if num_repos and not world[split]:
            raise RuntimeError(f"micro world built no {split} tasks from {num_repos} repos "
                               f"(see the drop reasons in {out / (split + '.store')})")
    return world
