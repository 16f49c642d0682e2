"""Micro-world tasks: generated repositories turned into tasks by the real pipeline.

    generate_repo(seed) x N  --carl.tasks.build.build_repo (same sandboxes, validation, scrub)-->
        <dir>/train.jsonl   tasks from the training repos
        <dir>/eval.jsonl    tasks from held-out repos (seeds disjoint from training: never trained on)

No shortcut for the micro world: the repositories are ordinary Python packages with pytest
suites, so every task is validated exactly like one from a real repository. Building is
resumable (the pipeline's append-only output and finished-repo record), so a restarted run
reuses what it built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from carl.micro.generate import generate_repo
from carl.tasks import TaskRecord, load_tasks
from carl.tasks.build import BuildConfig, build_repo, finished_specs, record_finished

EVAL_SEED_OFFSET = 100_000  # held-out repos use seeds >= this; training repos use seeds below it


@dataclass(frozen=True)
class MicroTasks:
    train: list[TaskRecord]
    eval: list[TaskRecord]
    train_path: Path
    eval_path: Path


def build_micro_tasks(out_dir: str | Path, seed: int, difficulty: int, train_repos: int, eval_repos: int,
                      modules_per_repo: int = 2, defs_per_module: int = 3, max_tasks_per_repo: int = 4,
                      backend: str = "bwrap", progress=None) -> MicroTasks:
    """Generate the repos and build their tasks (stub-mode function and method deletions)."""
    out = Path(out_dir)
    cfg = BuildConfig(max_per_repo=max_tasks_per_repo, modes=("stub",), kinds=("function", "method"),
                      seed=seed, backend=backend, task_timeout_s=60.0, suite_timeout_s=120.0)
    splits = {
        "train": [seed * 1000 + i for i in range(train_repos)],
        "eval": [EVAL_SEED_OFFSET + seed * 1000 + i for i in range(eval_repos)],
    }
    paths = {}
    for split, seeds in splits.items():
        tasks_path = out / f"{split}.jsonl"
        done = finished_specs(tasks_path)
        for s in seeds:
            repo_dir = out / "repos" / split / f"repo{s}"
            if str(repo_dir) in done:
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
        paths[split] = tasks_path
    # sorted: parallel validation appends tasks in completion order, the world must not depend on it
    train = sorted(load_tasks(paths["train"]) if paths["train"].exists() else [], key=lambda t: t.instance_id)
    held_out = sorted(load_tasks(paths["eval"]) if paths["eval"].exists() else [], key=lambda t: t.instance_id)
    if not train or not held_out:
        raise RuntimeError(f"micro world built {len(train)} training and {len(held_out)} held-out tasks; "
                           "expected some of each (see the drop reasons in the task store)")
    return MicroTasks(train, held_out, paths["train"], paths["eval"])
