"""`carl bench`: suites of real-repository tasks, and any agent scored on them. See docs/bench.md.

    carl bench build SUITE.toml | SOURCE... --out DIR    a pinned suite (carl.eval.suite_build)
    carl bench run --suite DIR (--checkpoint | --policy)  carl's harness on it (carl.eval.bench_run)
    carl bench grade --suite DIR | --tasks F --predictions P   any agent's patches (carl.eval.grade)
    carl bench report RESULTS.json --html OUT.html       plots and tables (carl.eval.html_report)
    carl bench compare A.json B.json                     paired difference (carl.eval.paired)
    carl bench export --tasks F --out swe.jsonl          SWE-bench / SWE-smith records
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

from carl.sandbox.base import BACKENDS, HOST_BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    from carl.commands.bench_build import build
    from carl.commands.eval import add_agent_args

    p = sub.add_parser("bench", help="suites of real-repository tasks; score any agent on them")
    bsub = p.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    b = bsub.add_parser("build", help="build a pinned suite (resumable) and check it against its lock")
    b.add_argument("suite", nargs="+", metavar="SUITE.toml | SOURCE",
                   help="a suite definition (TOML), or SOURCEs as `carl tasks build` takes them (DIR, DIR@REV, "
                        "pypi:NAME==VERSION[#sha256=HEX]) for a suite of the defaults named after --out")
    b.add_argument("--out", required=True, help="the suite directory (a rerun continues a killed build)")
    b.add_argument("--workers", type=int, help="candidates validated at once (default: the suite's build.workers)")
    b.add_argument("--backend", choices=list(HOST_BACKENDS), help="sandbox backend (default: the suite's)")
    b.add_argument("--update-lock", action="store_true",
                   help="take this build as the suite: rewrite the lock beside the definition")
    b.add_argument("--smoke-only", action="store_true",
                   help="build just the lock's smoke subset (validates those tasks alone: minutes instead of hours "
                        "for `carl bench run --smoke`); needs the lock a whole build wrote")
    b.add_argument("--catalog", help="with SOURCEs: a catalog (JSONL) of their test commands and deps")
    b.add_argument("--max-per-package", type=int, default=30, help="with SOURCEs: tasks per package (default 30)")
    b.set_defaults(func=build)

    r = bsub.add_parser("run", help="score a checkpoint or an OpenAI-compatible endpoint on a suite through carl's "
                                    "harness (resumable)")
    r.add_argument("--suite", required=True, help="a suite directory (carl bench build --out)")
    r.add_argument("--smoke", action="store_true", help="its smoke subset only (small tasks, for CPU models)")
    add_agent_args(r)
    r.add_argument("--name", help="the agent's name in the results (default: the checkpoint's folder, or the model)")
    r.add_argument("--workers", type=int, help="episodes at once, each in its own sandbox (default: the run "
                                               "config's rollout concurrency, else 16)")
    r.add_argument("--price", metavar="IN,OUT", help="USD per million input and output tokens (e.g. 0.15,0.60): "
                                                     "cost per task")
    _add_ray(r, "episodes", "its own policy and sandboxes")
    r.add_argument("--ray-gpus-per-actor", type=float, default=0.0,
                   help="with --ray: GPUs each actor asks for (a checkpoint on a GPU node; default 0)")
    _add_out(r, "bench_results.json", "samples")
    r.set_defaults(func=run)

    g = bsub.add_parser("grade", help="grade a predictions file (instance_id, model_patch) with the RL reward "
                                      "and its monitor (resumable)")
    tasks = g.add_mutually_exclusive_group(required=True)
    tasks.add_argument("--suite", help="a suite directory (carl bench build --out)")
    tasks.add_argument("--tasks", help="tasks JSONL (carl tasks build output)")
    g.add_argument("--smoke", action="store_true", help="with --suite: its smoke subset only")
    g.add_argument("--predictions", required=True,
                   help="JSONL, one {instance_id, model_patch, model_name_or_path} a line (or a .json list, or "
                        "an object keyed by instance_id); a prediction for a task not in the tasks is an error")
    g.add_argument("--workers", type=int, default=4, help="tasks graded at once (two sandboxes each)")
    g.add_argument("--sandbox", default="bwrap", choices=list(BACKENDS), help="(default bwrap)")
    _add_ray(g, "grades", "its own sandboxes")
    _add_out(g, "bench_report.json", "tasks")
    g.set_defaults(func=grade)

    rp = bsub.add_parser("report", help="a result's tables; --html: a self-contained page with plots")
    rp.add_argument("results", help="a result JSON (carl bench run / grade --out, or carl eval --out)")
    rp.add_argument("--html", help="write the page here (plots embedded, nothing loaded from elsewhere)")
    rp.add_argument("--fail-below", type=float, metavar="P", help="exit 3 when pass@1 is below P (a CI gate)")
    rp.set_defaults(func=report)

    c = bsub.add_parser("compare", help="two results of the same tasks, paired, with the standard error of the "
                                        "difference")
    c.add_argument("a", help="the baseline's result")
    c.add_argument("b", help="the result to compare with it (bench runs: scored with the same --seed)")
    c.add_argument("--out", help="also write the comparison as JSON")
    c.add_argument("--fail-if-worse", action="store_true",
                   help="exit 3 when B is below A by more than 1.64 paired standard errors (a CI gate)")
    c.set_defaults(func=compare)

    e = bsub.add_parser("export", help="write tasks as SWE-bench or SWE-smith task instances")
    e.add_argument("--tasks", required=True, help="tasks JSONL (carl tasks build output)")
    e.add_argument("--out", required=True, help="the JSONL to write, one task instance a line")
    e.add_argument("--format", default="swe-bench", choices=["swe-bench", "swe-smith"],
                   help="swe-bench: FAIL_TO_PASS/PASS_TO_PASS JSON-encoded, patch = the gold fix; swe-smith: "
                        "lists, patch = the bug (the gold fix reversed)")
    e.set_defaults(func=export)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _add_ray(p: argparse.ArgumentParser, what: str, builds: str) -> None:
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help=f"run the {what} in Ray actors: --ray alone starts a local Ray, --ray ADDRESS joins a "
                        f"cluster (e.g. auto, ray://head:10001); each actor builds {builds}, and the suite "
                        "directory must be at the same path on every node")
    p.add_argument("--ray-actors", type=int, default=2, help=f"with --ray: actors (default 2); --workers {what} "
                                                              "at once are spread over them")
    p.add_argument("--ray-cpus-per-actor", type=float, default=0.5,
                   help="with --ray: CPUs each actor asks Ray for (default 0.5: actors mostly wait on the model "
                        "and on test processes)")


def _add_out(p: argparse.ArgumentParser, default: str, unit: str) -> None:
    p.add_argument("--out", default=default,
                   help=f"the JSON result (default {default}); {unit} are appended to OUT.partial.jsonl as they "
                        "finish and a rerun reuses them (delete it to score everything again)")
    p.add_argument("--fail-below", type=float, metavar="P", help="exit 3 when pass@1 is below P (a CI gate)")


def grade(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from rich.console import Console

    from carl.errors import UserError
    from carl.eval.grade import GradeConfig, check_known, grade_all, load_partial, load_predictions
    from carl.eval.grade_report import build_grade_report, render_grade_table
    from carl.sandbox.base import SandboxConfig

    if args.workers < 1:
        raise UserError(f"--workers: got {args.workers}, expected >= 1")
    _check_ray(args)
    tasks, strata, where = _tasks_of(args)
    predictions = load_predictions(args.predictions)
    check_known(predictions, tasks, where["tasks_file"])
    partial = _partial(args.out)
    done = load_partial(partial, predictions)
    done = {k: v for k, v in done.items() if k in {t.instance_id for t in tasks}}
    console = Console()
    if done:
        console.print(f"{len(done)} of {len(tasks)} tasks already graded in {partial} (reused)")
    todo = len(tasks) - len(done)
    t0 = time.monotonic()
    config = GradeConfig(sandbox=SandboxConfig(backend=args.sandbox))

    def line(g) -> str:
        return f"{g.instance_id}: {g.status}" + (f" ({g.reason})" if g.reason else "") + f" {g.duration_s:.1f} s"

    with _progress(console, todo, "grading", line) as on_graded, _ray_grades(args, tasks, predictions, config, todo) as submit:
        results = grade_all(tasks, predictions, config, partial, args.workers, done, on_graded=on_graded,
                            submit=submit)
    names = sorted({p.model_name_or_path for p in predictions.values() if p.model_name_or_path})
    name = names[0] if len(names) == 1 else Path(args.predictions).stem
    report = build_grade_report(name, tasks, results, strata=strata, extra={
        **where, "predictions_file": str(args.predictions), "sandbox": args.sandbox,
        "monitor_action": config.monitor.action, "graded_now": todo, "wall_s": time.monotonic() - t0})
    return _write_result(console, render_grade_table(report), report, args.out, args.fail_below,
                         "no task was scored: every grade failed in the infrastructure (see the reasons in "
                         f"{args.out}); rerun to grade them again")


def _write_result(console, table, report: dict, out: str, fail_below, none_scored: str) -> int:
    """Show a result's table, write its JSON atomically, and exit as a CI gate would: 1 when nothing
    was scored (`none_scored` says why), else `_gate` against --fail-below."""
    from carl.io import atomic_write_json

    console.print(table)
    atomic_write_json(out, report)
    console.print(f"results written to {out}")
    if report["summary"]["n"] == 0:
        print(f"carl: {none_scored}", file=sys.stderr)
        return 1
    return _gate(report, fail_below)


def run(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from carl.errors import UserError
    from carl.eval.bench import RL_MONITOR, to_sample
    from carl.eval.bench_run import build_run_report, load_partial_samples, render_run_table, run_key
    from carl.commands.eval import agent_setup, policy_recipe
    from carl.eval.suite import open_suite
    from carl.io import append_jsonl
    from carl.types import to_jsonable

    setup = agent_setup(args)
    price = _price(args.price)
    workers = args.workers if args.workers is not None else setup.concurrency
    if workers < 1:
        raise UserError(f"--workers: got {workers}, expected >= 1")
    _check_threshold(args.fail_below)
    _check_ray(args)
    suite = open_suite(args.suite, args.smoke)
    settings = {**setup.settings(args), "suite_lock_sha256": suite.lock_sha256, "smoke": args.smoke}
    key = run_key(settings)
    partial = _partial(args.out)
    done = load_partial_samples(partial, key)
    ids = {t.instance_id for t in suite.tasks}
    done = {k: v for k, v in done.items() if k[0] in ids and k[1] < setup.samples}
    console = Console()
    if done:
        console.print(f"{len(done)} samples already scored in {partial} (reused)")
    todo = len(suite.tasks) * setup.samples - len(done)
    t0 = time.monotonic()
    new = []
    if todo:
        recipe = policy_recipe(args, setup.run)

        def line(s) -> str:
            verdict = "infra failure: " + s.error if s.infra_failure else ("passed" if s.passed else "failed")
            return f"{s.task_id} #{s.sample}: {verdict}, {s.tool_calls} tool calls, {s.wall_s:.1f} s"

        with _progress(console, todo, f"{suite.name}{' (smoke)' if args.smoke else ''}", line) as on_done:
            def record(t: int, j: int, rollout) -> None:
                sample = to_sample(rollout, j)
                append_jsonl(partial, {"run_key": key, **to_jsonable(sample)})
                new.append(sample)
                on_done(sample)

            _sample(args, recipe, suite.tasks, setup, workers, set(done), record)
    extra = {"suite": suite.name, "suite_dir": str(suite.dir), **settings, "monitor_action": RL_MONITOR.action,
             "workers": workers, "run_key": key, "sampled_now": len(new), "wall_s": time.monotonic() - t0,
             **({"ray": args.ray, "ray_actors": args.ray_actors} if args.ray else {})}
    report = build_run_report(args.name or setup.name, suite.tasks, [*done.values(), *new], setup.samples,
                              suite.config.strata, price, extra)
    return _write_result(console, render_run_table(report), report, args.out, args.fail_below,
                         "no sample was scored: every episode failed in the infrastructure (see infra_errors in "
                         f"{args.out}); rerun to run them again")


def _sample(args: argparse.Namespace, recipe: Any, tasks: list, setup: Any, workers: int, skip: set,
            record: Callable[[int, int, Any], None]) -> None:
    """Every sample not in `skip`, `workers` at once: in threads of this process sharing one policy,
    or (--ray) in Ray actors that each build their own (carl.eval.bench.BenchEpisodes)."""
    from carl.eval.bench import RL_MONITOR, BenchEpisodes, drive, pending_samples, run_samples

    if not args.ray:
        policy = recipe.build()
        try:
            run_samples(policy, tasks, setup.samples, setup.limits, setup.tools, setup.sandbox, workers,
                        skip=skip, on_sample=record)
        finally:
            if hasattr(policy, "close"):
                policy.close()
        return
    jobs = pending_samples(tasks, setup.samples, skip)
    spec = BenchEpisodes(recipe, tasks, setup.limits, tuple(setup.tools), setup.sandbox, RL_MONITOR)
    pool = _ray_pool(args, spec, len(jobs), workers, "carl bench run --ray")
    try:
        drive(pool.submit, jobs, record)
    finally:
        pool.close()


@contextlib.contextmanager
def _ray_grades(args: argparse.Namespace, tasks: list, predictions: dict, config: Any, todo: int) -> Iterator[Any]:
    """With --ray, submit(task index) -> Future of its grade, run by Ray actors (carl.eval.grade.GradeJobs);
    None (threads of this process) without, or with nothing to grade."""
    if not args.ray or not todo:
        yield None
        return
    from carl.eval.grade import GradeJobs

    pool = _ray_pool(args, GradeJobs(tasks, predictions, config), todo, args.workers, "carl bench grade --ray")
    try:
        yield lambda t: pool.submit(t, 0, 0)
    finally:
        pool.close()


def _ray_pool(args: argparse.Namespace, spec: Any, jobs: int, workers: int, needed_by: str) -> Any:
    """--ray-actors actors (no more than `jobs`) running `spec`'s jobs, `workers` at once over all of them."""
    from carl.rollout.workers import RayWorkers

    actors = min(args.ray_actors, jobs)
    return RayWorkers(spec, actors, per_actor=max(1, -(-min(workers, jobs) // actors)),
                      cpus_per_actor=args.ray_cpus_per_actor, gpus_per_actor=getattr(args, "ray_gpus_per_actor", 0.0),
                      address="" if args.ray == "local" else args.ray, needed_by=needed_by)


def _check_ray(args: argparse.Namespace) -> None:
    from carl.errors import UserError

    if args.ray_actors < 1:
        raise UserError(f"--ray-actors: got {args.ray_actors}, expected >= 1")
    for flag, value in (("--ray-cpus-per-actor", args.ray_cpus_per_actor),
                        ("--ray-gpus-per-actor", getattr(args, "ray_gpus_per_actor", 0.0))):
        if not value >= 0:
            raise UserError(f"{flag}: got {value:g}, expected a number >= 0")
    if args.ray and args.ray != "local":
        ok = args.ray == "auto" or args.ray.startswith("ray://") or (":" in args.ray and not args.ray.startswith("-"))
        if not ok:
            raise UserError(f"--ray: got {args.ray!r}, expected nothing (a local Ray), auto, ray://HOST:PORT or "
                            "HOST:PORT")


def report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from carl.eval.bench_compare import load_result, result_kind

    _check_threshold(args.fail_below)
    result = load_result(args.results, "RESULTS")
    console = Console()
    if result_kind(result) == "grade":
        from carl.eval.grade_report import render_grade_table

        console.print(render_grade_table(result))
    elif "strata" in result:
        from carl.eval.bench_run import render_run_table

        console.print(render_run_table(result))
    else:  # a `carl eval` report: its own table
        from carl.eval.report import BenchReport, TaskReport, render_table

        k = result["summary"].get("k", 1)
        console.print(render_table(BenchReport(result["summary"].get("name", ""), k,
                                               [TaskReport(**t) for t in result["tasks"]])))
    if args.html:
        from carl.eval.html_report import render_html
        from carl.io import atomic_write_text

        atomic_write_text(args.html, render_html(result))
        console.print(f"report written to {args.html} ({Path(args.html).stat().st_size // 1024} KiB, self-contained)")
    return _gate(result, args.fail_below)


def compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.eval.bench_compare import Z_WORSE, compare_results, load_result, render, worse

    c = compare_results(load_result(args.a, "A"), load_result(args.b, "B"))
    render(c, Console())
    if args.out:
        from carl.io import atomic_write_json

        atomic_write_json(args.out, c)
    if args.fail_if_worse and worse(c):
        print(f"carl: B is worse than A by more than {Z_WORSE} paired standard errors ({c['diff']:+.3f} ± "
              f"{c['se_paired']:.3f})", file=sys.stderr)
        return 3
    return 0


def _tasks_of(args: argparse.Namespace):
    """(tasks, strata config, where they came from) of --suite [--smoke] or --tasks."""
    from carl.errors import UserError
    from carl.eval.strata import StrataConfig
    from carl.tasks import load_tasks

    if args.suite:
        from carl.eval.suite import open_suite

        suite = open_suite(args.suite, args.smoke)
        tasks_file = suite.dir / ("smoke.jsonl" if args.smoke else "tasks.jsonl")
        return suite.tasks, suite.config.strata, {"suite": suite.name, "suite_dir": str(suite.dir), "smoke": args.smoke,
                                                  "suite_lock_sha256": suite.lock_sha256, "tasks_file": str(tasks_file)}
    if args.smoke:
        raise UserError("--smoke: a suite's smoke subset, expected --suite DIR with it (not --tasks)")
    tasks = load_tasks(args.tasks, require_repos=True)
    if not tasks:
        raise UserError(f"--tasks: {args.tasks!r} holds no task, expected at least one")
    return tasks, StrataConfig(), {"tasks_file": str(args.tasks)}


def _partial(out: str):
    from pathlib import Path

    return Path(out).with_name(Path(out).name + ".partial.jsonl")


@contextlib.contextmanager
def _progress(console, total: int, what: str, line: Callable[[Any], str]) -> Iterator[Callable[[Any], None]]:
    """A callback for each finished item: a progress bar on a terminal, else one line each (a log)."""
    if console.is_terminal:
        from rich.progress import Progress

        with Progress(console=console) as progress:
            bar = progress.add_task(what, total=total)
            yield lambda item: progress.advance(bar)
    else:
        count = itertools.count(1)
        yield lambda item: print(f"[{next(count)}/{total}] {line(item)}", flush=True)


def _price(text: str | None):
    """--price IN,OUT -> Price; UserError naming the flag and the expected form."""
    if text is None:
        return None
    from carl.errors import UserError
    from carl.eval.bench_run import Price

    try:
        a, b = (float(x) for x in text.split(","))
        return Price(a, b)
    except ValueError as e:
        raise UserError(f"--price: got {text!r}, expected IN,OUT: US dollars per million input and output tokens, "
                        f"two numbers >= 0 such as 0.15,0.60 ({e})") from None


def _check_threshold(p: float | None) -> None:
    from carl.errors import UserError

    if p is not None and not 0 <= p <= 1:
        raise UserError(f"--fail-below: got {p}, expected a pass@1 between 0 and 1")


def _gate(result: dict, threshold: float | None) -> int:
    """3 when pass@1 is below --fail-below (said on stderr), else 0."""
    if threshold is None or result["summary"]["pass@1"] >= threshold:
        return 0
    print(f"carl: pass@1 {result['summary']['pass@1']:.3f} is below --fail-below {threshold}", file=sys.stderr)
    return 3


def export(args: argparse.Namespace) -> int:
    from carl.eval.export import FORMATS
    from carl.io import atomic_write_jsonl
    from carl.tasks import load_tasks

    tasks = load_tasks(args.tasks)
    atomic_write_jsonl(args.out, [FORMATS[args.format](t) for t in tasks])
    print(f"wrote {len(tasks)} {args.format} task instances to {args.out}")
    return 0

