"""Build feature-deletion tasks from the dev packages and report yield and cost.

    .venv/bin/python benchmarks/tasks.py --packages toolz,cachetools,h11 --max-per-repo 50

Per package and in total: validated tasks, drop reasons, wall time, the cost of the per-test map
(traced suite run / plain run), and time per validated task as a ratio to
  (a) the summed call time of that task's own FAIL_TO_PASS + PASS_TO_PASS tests (pytest's
      durations: excludes interpreter start and collection), and
  (b) the wall time of one sandboxed pytest run of those tests on the original code (the floor:
      each task must be run at least once), measured here after the build for every task, in one
      sandbox, under the same conditions.
Needs PyPI (sdists and test dependencies); venvs are cached under $CARL_CACHE_DIR/envs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import closing
from pathlib import Path

from carl.sandbox import open_sandbox
from carl.sandbox.base import SandboxConfig
from carl.tasks import load_tasks, original_repo_dir, sandbox_config_for
from carl.tasks.build import BuildConfig, build_repo
from carl.tasks.suite import run_suite

DEV_LIST = Path(__file__).resolve().parents[2] / "shared" / "repos" / "dev.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--packages", default="toolz,cachetools,h11", help="comma list of names from the dev list"
    )
    ap.add_argument("--dev-list", default=str(DEV_LIST))
    ap.add_argument("--max-per-repo", type=int, default=50)
    ap.add_argument("--backend", default="bwrap")
    ap.add_argument("--out", default="/tmp/carl-bench-tasks/tasks.jsonl")
    ap.add_argument("--no-gold-run", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2, help="candidates validated at once")
    args = ap.parse_args()

    entries = {d["name"]: d for d in map(json.loads, Path(args.dev_list).read_text().splitlines()) if d}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = BuildConfig(
        max_per_repo=args.max_per_repo,
        backend=args.backend,
        catalog=args.dev_list,
        gold_run=not args.no_gold_run,
        seed=args.seed,
        workers=args.workers,
    )
    rows = []
    t_all = time.perf_counter()
    for name in args.packages.split(","):
        e = entries[name]
        spec = f"pypi:{name}=={e['version']}#sha256={e['sdist_sha256']}"
        r = build_repo(
            spec,
            out,
            cfg,
            on_task=lambda r, name=name: print(
                f"  {name}: {r.n_tasks} tasks / {r.n_attempts} tried", end="\r", flush=True
            ),
        )
        rows.append(r)
        print(" " * 60, end="\r")
        if r.status != "ok":
            print(f"{name}: FAILED {r.error}")
            continue
        per_task = r.wall_s / max(r.n_tasks, 1)
        test_s = statistics.mean(r.task_test_s) if r.task_test_s else float("nan")
        run_s = floor_run_s(out, r.name, args.backend)
        wall_s = statistics.mean(r.task_wall_s) if r.task_wall_s else float("nan")
        print(
            f"{name}: {r.n_tasks} validated / {r.n_attempts} tried / {r.n_candidates} candidates; "
            f"tests kept {r.n_tests}, dropped flaky/failing {r.n_flaky_or_failing}"
        )
        print(f"  drops: {dict(r.drops) or '-'}")
        print(
            f"  wall {r.wall_s:.1f}s (baseline suite {r.suite_s:.1f}s, traced {r.trace_s:.1f}s = "
            f"{r.trace_s / r.suite_s:.2f}x)"
        )
        runs = [statistics.mean(col) for col in zip(*r.task_runs_s)]
        print(
            f"  per validated task: {per_task:.2f}s all-in, {wall_s:.2f}s validating it, of which runs "
            + " + ".join(f"{x:.2f}s" for x in runs)
            + f" (broken, broken again{', gold' if len(runs) == 3 else ''})"
        )
        print(f"  its own tests: {test_s * 1000:.1f}ms of test calls; one sandboxed run of them {run_s:.2f}s")
        throughput_s = r.validate_s / max(r.n_tasks, 1)
        print(f"  throughput: validating took {r.validate_s:.1f}s with {args.workers} workers = "
              f"{throughput_s:.2f}s per validated task (drops included) = {throughput_s / run_s:.2f}x one run")
        print(
            f"  ratio per validated task: {wall_s / test_s:.0f}x own tests' call time; {wall_s / run_s:.2f}x one "
            f"run of them (all-in {per_task / run_s:.2f}x; without the gold run "
            f"{(wall_s - (runs[2] if len(runs) == 3 else 0)) / run_s:.2f}x)"
        )
    total_tasks = sum(r.n_tasks for r in rows)
    print(
        f"TOTAL: {total_tasks} validated tasks from {len(rows)} packages in {time.perf_counter() - t_all:.0f}s"
    )


def floor_run_s(out: Path, repo: str, backend: str) -> float:
    """Mean over the repo's tasks of the wall time of one sandboxed run of a task's own tests on the
    original code."""
    tasks = [t for t in load_tasks(out) if t.repo == repo]
    if not tasks:
        return float("nan")
    walls = []
    cfg = sandbox_config_for(tasks[0], SandboxConfig(backend=backend, timeout_s=300))
    with closing(open_sandbox(original_repo_dir(tasks[0]), cfg)) as sb:
        for t in tasks:
            targets = sorted(set(t.FAIL_TO_PASS) | set(t.PASS_TO_PASS))
            pythonpath = tuple(t.environment.get("pythonpath", ()))
            walls.append(run_suite(sb, t.test_command, targets, timeout_s=300, pythonpath=pythonpath).wall_s)
    return statistics.mean(walls)


if __name__ == "__main__":
    main()
