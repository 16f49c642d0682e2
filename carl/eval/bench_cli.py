"""`carl bench grade`: score any agent's predictions (SWE-bench style) with the RL reward.
`carl bench export`: write tasks as SWE-bench or SWE-smith task instances for other tools.
See docs/bench.md."""

from __future__ import annotations

import argparse

from carl.sandbox.base import BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="grade any agent's predictions with the RL reward; export tasks")
    bsub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    g = bsub.add_parser("grade", help="grade a predictions file (instance_id, model_patch) with the RL reward "
                                      "and its monitor (resumable)")
    g.add_argument("--tasks", required=True, help="tasks JSONL (carl tasks build output)")
    g.add_argument("--predictions", required=True,
                   help="JSONL, one {instance_id, model_patch, model_name_or_path} a line (or a .json list, or "
                        "an object keyed by instance_id); a prediction for a task not in --tasks is an error")
    g.add_argument("--out", default="bench_report.json",
                   help="the JSON report; results are appended to OUT.partial.jsonl as tasks finish and a rerun "
                        "reuses them (delete it to grade again)")
    g.add_argument("--workers", type=int, default=4, help="tasks graded at once (two sandboxes each)")
    g.add_argument("--sandbox", default="bwrap", choices=list(BACKENDS), help="(default bwrap)")
    g.set_defaults(func=grade)
    e = bsub.add_parser("export", help="write tasks as SWE-bench or SWE-smith task instances")
    e.add_argument("--tasks", required=True, help="tasks JSONL (carl tasks build output)")
    e.add_argument("--out", required=True, help="the JSONL to write, one task instance a line")
    e.add_argument("--format", default="swe-bench", choices=["swe-bench", "swe-smith"],
                   help="swe-bench: FAIL_TO_PASS/PASS_TO_PASS JSON-encoded, patch = the gold fix; swe-smith: "
                        "lists, patch = the bug (the gold fix reversed)")
    e.set_defaults(func=export)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def grade(args: argparse.Namespace) -> int:
    import sys
    import time
    from pathlib import Path

    from rich.console import Console

    from carl.errors import UserError
    from carl.eval.grade import GradeConfig, check_known, grade_all, load_partial, load_predictions
    from carl.eval.grade_report import build_grade_report, render_grade_table
    from carl.io import atomic_write_json
    from carl.sandbox.base import SandboxConfig
    from carl.tasks import load_tasks

    if args.workers < 1:
        raise UserError(f"--workers: got {args.workers}, expected >= 1")
    tasks = load_tasks(args.tasks, require_repos=True)
    if not tasks:
        raise UserError(f"--tasks: {args.tasks!r} holds no task, expected at least one")
    predictions = load_predictions(args.predictions)
    check_known(predictions, tasks, args.tasks)
    partial = Path(args.out).with_name(Path(args.out).name + ".partial.jsonl")
    done = load_partial(partial, predictions)
    done = {k: v for k, v in done.items() if k in {t.instance_id for t in tasks}}
    console = Console()
    if done:
        console.print(f"{len(done)} of {len(tasks)} tasks already graded in {partial} (reused)")
    todo = len(tasks) - len(done)
    t0 = time.monotonic()
    config = GradeConfig(sandbox=SandboxConfig(backend=args.sandbox))
    if console.is_terminal:
        from rich.progress import Progress

        with Progress(console=console) as progress:
            bar = progress.add_task("grading", total=todo)
            results = grade_all(tasks, predictions, config, partial, args.workers, done,
                                on_graded=lambda g: progress.advance(bar))
    else:  # a log: one line per task as it finishes
        count = iter(range(1, todo + 1))

        def line(g) -> None:
            print(f"[{next(count)}/{todo}] {g.instance_id}: {g.status}"
                  + (f" ({g.reason})" if g.reason else "") + f" {g.duration_s:.1f} s", flush=True)

        results = grade_all(tasks, predictions, config, partial, args.workers, done, on_graded=line)
    names = sorted({p.model_name_or_path for p in predictions.values() if p.model_name_or_path})
    name = names[0] if len(names) == 1 else Path(args.predictions).stem
    report = build_grade_report(name, tasks, results, extra={
        "tasks_file": str(args.tasks), "predictions_file": str(args.predictions), "sandbox": args.sandbox,
        "monitor_action": config.monitor.action, "graded_now": todo, "wall_s": time.monotonic() - t0})
    console.print(render_grade_table(report))
    atomic_write_json(args.out, report)
    console.print(f"report written to {args.out}")
    s = report["summary"]
    if s["n"] == 0:
        print("carl: no task was scored: every grade failed in the infrastructure (see the reasons in "
              f"{args.out}); rerun to grade them again", file=sys.stderr)
        return 1
    return 0


def export(args: argparse.Namespace) -> int:
    from carl.eval.export import FORMATS
    from carl.io import atomic_write_jsonl
    from carl.tasks import load_tasks

    tasks = load_tasks(args.tasks)
    atomic_write_jsonl(args.out, [FORMATS[args.format](t) for t in tasks])
    print(f"wrote {len(tasks)} {args.format} task instances to {args.out}")
    return 0
