"""`carl tasks build|validate|stats|show`."""

from __future__ import annotations

import argparse
from carl.sandbox.base import HOST_BACKENDS


def register(subparsers) -> None:
    p = subparsers.add_parser("tasks", help="build and inspect feature-deletion tasks")
    sub = p.add_subparsers(dest="tasks_command", metavar="SUBCOMMAND")

    b = sub.add_parser("build", help="make tasks from repositories (resumable)")
    b.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="DIR, DIR@REV or pypi:NAME==VERSION[#sha256=HEX]"
    )
    b.add_argument("--out", required=True, help="task JSONL file (appended; its store sits next to it)")
    b.add_argument("--max-per-repo", type=int, default=50)
    b.add_argument("--max-attempts-per-repo", type=int, default=0, help="0 = 4 x --max-per-repo")
    b.add_argument("--modes", default="stub,remove", help="comma list of stub, remove")
    b.add_argument("--kinds", default="function,method,class,module,cluster", help="comma list")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--workers", type=int, default=2, help="candidates validated at once (one sandbox each)")
    b.add_argument("--backend", default="bwrap", choices=list(HOST_BACKENDS), help="sandbox backend")
    b.add_argument("--catalog", help="JSONL, a package a line: test_deps, test_command, env (docs/tasks.md)")
    b.add_argument("--python-env", help="use this venv instead of preparing one per repo")
    b.add_argument(
        "--no-gold-run", action="store_true", help="trust byte-exact gold patch instead of a 3rd run"
    )
    b.add_argument("--task-timeout", type=float, default=120.0, help="max seconds per validation run")
    b.add_argument(
        "--slow-factor",
        type=float,
        default=5.0,
        help="drop a task whose run takes > this x the baseline suite run",
    )
    b.add_argument("--suite-timeout", type=float, default=900.0, help="seconds per baseline suite run")
    b.set_defaults(func=_build)

    v = sub.add_parser("validate", help="re-check every task: broken fails, gold patch passes")
    v.add_argument("file")
    v.add_argument("--backend", default="bwrap", choices=list(HOST_BACKENDS))
    v.add_argument("--timeout", type=float, default=120.0)
    v.set_defaults(func=_validate)

    s = sub.add_parser("stats", help="counts by repo, kind, mode, size; drop reasons")
    s.add_argument("file")
    s.set_defaults(func=_stats)

    sh = sub.add_parser("show", help="one task's problem statement and gold patch")
    sh.add_argument("id")
    sh.add_argument("--tasks", required=True, help="task JSONL file")
    sh.set_defaults(func=_show)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    from carl.errors import UserError
    from carl.tasks.build import (
        BuildConfig,
        RepoResult,
        build_repo,
        check_sources,
        finished_specs,
        record_finished,
    )
    from carl.tasks.catalog import read_catalog
    from carl.tasks.report import repo_note, summary_table
    from carl.tasks.store import store_dir

    try:
        cfg = BuildConfig(
            max_per_repo=args.max_per_repo,
            max_attempts_per_repo=args.max_attempts_per_repo,
            modes=tuple(x for x in args.modes.split(",") if x),
            kinds=tuple(x for x in args.kinds.split(",") if x),
            seed=args.seed,
            workers=args.workers,
            backend=args.backend,
            suite_timeout_s=args.suite_timeout,
            task_timeout_s=args.task_timeout,
            slow_factor=args.slow_factor,
            gold_run=not args.no_gold_run,
            python_env=args.python_env,
            catalog=args.catalog,
        )
    except ValueError as e:
        raise UserError(str(e)) from None
    check_sources(args.sources)
    if cfg.catalog:
        read_catalog(cfg.catalog)  # a bad catalog is the user's to fix before any work
    out = Path(args.out)
    try:
        done = finished_specs(out)
    except ValueError as e:  # a garbled repos.jsonl; the message names the file and line
        raise UserError(f"cannot resume: {e}") from None
    # One line a repo on stdout as it finishes, flushed, so a log or a pipe shows progress as it
    # goes; the live bar is on stderr and drawn only when that is a terminal (then the lines print
    # above it).
    def line(text: str) -> None:
        print(text, flush=True)

    results = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        for spec in args.sources:
            if spec in done:
                results.append(RepoResult(spec, name=spec, status="skipped"))
                line(f"{spec}: skipped, built into {out} before (its line in {store_dir(out)}/repos.jsonl; "
                     "a build that failed without tasks is tried again)")
                continue
            bar = progress.add_task(spec, total=cfg.max_per_repo)
            result = build_repo(
                spec,
                out,
                cfg,
                on_task=lambda r, bar=bar, spec=spec: progress.update(
                    bar, completed=r.n_tasks, description=f"{spec}  tasks {r.n_tasks}  tried {r.n_attempts}"
                ),
            )
            progress.remove_task(bar)
            record_finished(out, result)
            results.append(result)
            note = repo_note(result)
            line(f"{spec}: {result.status} {result.n_tasks} tasks in {result.wall_s:.0f}s"
                 + (f"  ({note})" if note else ""))
    Console().print(summary_table(results))
    return 0 if all(r.status != "failed" for r in results) else 1


def _validate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.errors import UserError
    from carl.sandbox.base import SandboxConfig
    from carl.tasks.recheck import recheck_task
    from carl.tasks.store import load_tasks

    tasks = load_tasks(args.file)
    if not tasks:
        raise UserError(f"task file {args.file}: no tasks in it; expected one task record a line")
    console = Console()
    bad = 0
    for t in tasks:
        problem = recheck_task(t, SandboxConfig(backend=args.backend, timeout_s=args.timeout))
        bad += problem is not None
        console.print(
            f"{'FAIL' if problem else 'ok  '} {t.instance_id}" + (f"  {problem}" if problem else "")
        )
    console.print(f"{len(tasks) - bad}/{len(tasks)} tasks valid")
    return 1 if bad else 0


def _stats(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.errors import UserError
    from carl.tasks.report import stats_tables
    from carl.tasks.store import load_tasks

    tasks = load_tasks(args.file)
    try:
        tables = stats_tables(tasks, args.file)
    except ValueError as e:  # a garbled drops.jsonl in the store; the message names the file and line
        raise UserError(str(e)) from None
    console = Console()
    for table in tables:
        console.print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    from carl.errors import UserError
    from carl.tasks.store import load_tasks

    for t in load_tasks(args.tasks):
        if t.instance_id == args.id:
            print(
                f"# {t.instance_id}  ({t.deletion_kind}, {t.deletion_mode}, {t.size_lines} lines, "
                f"{t.size_files} files)\n"
            )
            print(t.problem_statement)
            print(f"FAIL_TO_PASS ({len(t.FAIL_TO_PASS)}), PASS_TO_PASS ({len(t.PASS_TO_PASS)})\n")
            print("# gold patch\n")
            print(t.patch)
            return 0
    raise UserError(f"no task with id {args.id!r} in {args.tasks}")
