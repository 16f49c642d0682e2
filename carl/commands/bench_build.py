"""`carl bench build`: a suite definition (or SOURCEs) -> a suite directory, checked against its
lock (carl.eval.suite, carl.eval.suite_build); progress as `carl tasks build` shows it."""

from __future__ import annotations

import argparse
import sys


def build(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import time
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    from carl.errors import UserError
    from carl.eval.suite_build import build_pool, finish_suite, lock_path, write_suite
    from carl.io import atomic_write_json, read_jsonl

    out = Path(args.out)
    config, definition = _suite_definition(args)
    build_cfg = config.build
    try:
        build_cfg = dataclasses.replace(build_cfg, **{k: v for k, v in (("workers", args.workers),
                                                                        ("backend", args.backend)) if v is not None})
    except ValueError as e:
        raise UserError(f"--workers / --backend: {e}") from None
    lock_file = lock_path(definition)
    reference = None
    if lock_file.is_file() and not args.update_lock:
        try:
            reference = json.loads(lock_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"lock {str(lock_file)!r} is not JSON ({e}); restore it, or rebuild with "
                            "--update-lock") from None
    only = _smoke_only_ids(args, out, lock_file, reference)
    t0 = time.monotonic()
    console = Console()
    specs = config.specs()
    with Progress(console=Console(stderr=True), transient=True) as progress:
        overall = progress.add_task(f"suite {config.name}", total=len(specs))
        bars: list = []

        def start(spec: str) -> None:
            from carl.eval.suite_build import package_key

            bars.append(progress.add_task(spec, total=config.build_for(package_key(spec)[0]).max_per_repo))

        def task_done(r) -> None:
            progress.update(bars[-1], completed=r.n_tasks,
                            description=f"{r.spec}  tasks {r.n_tasks}  tried {r.n_attempts}")

        def done(r) -> None:
            if bars:
                progress.remove_task(bars.pop())
            progress.advance(overall)
            note = f" ({r.error or r.warning})" if r.error or r.warning else ""
            print(f"{r.spec}: {r.status}" + (f" {r.n_tasks} tasks in {r.wall_s:.0f} s" if r.status != "skipped"
                                              else " (built before, in its pool)") + note, flush=True)

        build_pool(config, out, build_cfg, start, task_done, done, only)
    result = finish_suite(config, out, reference, smoke_only=only is not None)
    write_suite(config, out, result)
    if reference is None:
        atomic_write_json(lock_file, result.lock)
    repos = {d["spec"]: d for d in read_jsonl(out / "pool.store" / "repos.jsonl")} \
        if (out / "pool.store" / "repos.jsonl").is_file() else {}
    report = _build_report(config, specs, repos, result, lock_file, reference is None, time.monotonic() - t0)
    atomic_write_json(out / "build.json", report)
    console.print(_build_table(report))
    print("\n".join(_strata_lines(report, config)))
    check = result.check
    what = (f"the smoke subset alone, {len(result.smoke)} tasks" if result.smoke_only
            else f"{len(result.tasks)} tasks ({len(result.smoke)} in the smoke subset)")
    print(f"suite {config.name}: {what} in {out}; "
          + (f"lock written to {lock_file}" if reference is None else f"checked against {lock_file}"))
    failed = [p for p in report["packages"] if p["status"] == "failed"]
    for p in failed:
        print(f"carl: {p['spec']} gave no tasks: {p['error']} (a rerun tries it again)", file=sys.stderr)
    if check is None or check.ok:
        if check is not None and check.new:
            print(f"note: the pipeline also made {len(check.new)} tasks the lock does not list (not in the suite): "
                  + _ids(check.new))
        return 1 if failed else 0
    for line in check.settings:
        print(f"setting changed since the lock: {line}", file=sys.stderr)
    if check.missing:
        changed = set(check.changed)
        locked = f"{len(reference['smoke'])} smoke" if result.smoke_only else f"{len(reference['tasks'])}"
        print(f"{len(check.missing)} of the lock's {locked} tasks did not come out of this build "
              f"and are not in the suite: {_ids([i for i in check.missing if i not in changed])}"
              + (f"; built differently (gold patch or tests): {_ids(check.changed)}" if check.changed else ""),
              file=sys.stderr)
    if check.new:
        print(f"{len(check.new)} tasks came out that the lock does not list: {_ids(check.new)}", file=sys.stderr)
    print(f"the suite in {out} is not the locked one; see why in {out / 'pool.store'} (repos.jsonl, drops.jsonl), "
          "or take this build as the suite with --update-lock", file=sys.stderr)
    return 1


def _smoke_only_ids(args, out, lock_file, reference) -> frozenset[str] | None:
    """The task ids `--smoke-only` builds (the lock's smoke subset), None without it. The subset is
    the smallest tasks of the whole selected suite, so only a lock names it; a directory holds a
    smoke-only build or a whole one, never a mix (the pool records which sources are finished)."""
    from carl.errors import UserError
    from carl.eval.suite import SMOKE_ONLY_MARK
    from carl.io import atomic_write_text

    mark, built = out / SMOKE_ONLY_MARK, (out / "pool.store" / "repos.jsonl").is_file()
    if not args.smoke_only:
        if mark.is_file():
            raise UserError(f"--out: {str(out)!r} holds a smoke-only build (carl bench build --smoke-only); "
                            "build the whole suite into another directory")
        return None
    if args.update_lock:
        raise UserError("--smoke-only with --update-lock: a lock is written by a whole build, which picks the "
                        "smoke subset; drop one of the two")
    if reference is None:
        raise UserError(f"--smoke-only: no lock at {str(lock_file)!r}; the smoke subset is the smallest tasks of the "
                        "selected suite, which only a whole build (it writes the lock) or its lock names")
    if built and not mark.is_file():
        raise UserError(f"--smoke-only: {str(out)!r} holds a whole build, whose smoke subset is its smoke.jsonl; "
                        "rerun without --smoke-only to finish it, or pick another --out")
    ids = frozenset(reference.get("smoke", []))
    if not ids:
        raise UserError(f"--smoke-only: the lock {str(lock_file)!r} lists no smoke subset (smoke.per_package is 0?)")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(mark, "".join(f"{i}\n" for i in sorted(ids)))
    return ids


def _ids(ids: list[str], shown: int = 8) -> str:
    return ", ".join(ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _suite_definition(args):
    """(SuiteConfig, path of its definition) from `carl bench build`'s arguments: a TOML file, or
    SOURCEs, whose definition is written as DIR/suite.toml (its lock then lives beside it)."""
    from pathlib import Path

    from carl.errors import UserError
    from carl.eval.suite import SelectConfig, SuiteConfig, resolve_source, load_suite_config
    from carl.tasks.build import BuildConfig, check_sources

    if len(args.suite) == 1 and args.suite[0].endswith(".toml"):
        return load_suite_config(args.suite[0]), Path(args.suite[0])
    if any(s.endswith(".toml") for s in args.suite):
        raise UserError(f"SUITE: got {args.suite}, expected one suite file (TOML) or SOURCEs, not both")
    check_sources(args.suite)
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(args.out).resolve().name) or "suite"
    catalog = str(Path(args.catalog).resolve()) if args.catalog else None
    if catalog:
        from carl.tasks.catalog import read_catalog

        read_catalog(catalog)
    try:
        # a quarter more tasks made than kept, for the balanced selection to choose from
        surplus = max(1, args.max_per_package // 4)
        config = SuiteConfig(name=name, sources=tuple(resolve_source(s, Path.cwd()) for s in args.suite),
                             build=BuildConfig(catalog=catalog, max_per_repo=args.max_per_package + surplus),
                             select=SelectConfig(max_per_package=args.max_per_package))
    except ValueError as e:
        raise UserError(f"--max-per-package / SOURCE: {e}") from None
    return config, Path(args.out) / "suite.toml"


def _build_report(config, specs, repos, result, lock_file, wrote_lock, wall_s) -> dict:
    """build.json: per package what the pipeline made and what the suite kept, and the lock check."""
    import dataclasses
    import os
    import platform

    from carl.eval.suite_build import make_lock, package_key

    packages = []
    for spec in specs:
        r = repos.get(spec, {})
        name, version = package_key(spec)
        key = name + (f"=={version}" if version else "")
        packages.append({"spec": spec, "name": name, "version": version, "status": r.get("status", "not built"),
                         "built": r.get("n_tasks", 0), "kept": result.kept.get(key, 0),
                         "smoke": sum((t.repo, t.version) == (name, version) for t in result.smoke),
                         "tried": r.get("n_attempts", 0), "drops": r.get("drops", {}), "wall_s": r.get("wall_s", 0.0),
                         "suite_s": r.get("suite_s", 0.0), "tests": r.get("n_tests", 0),
                         "error": r.get("error", ""), "warning": r.get("warning", "")})
    return {"suite": config.name, "tasks": len(result.tasks), "smoke": len(result.smoke),
            "smoke_only": result.smoke_only,
            "strata": make_lock(config, result.tasks, result.smoke)["counts"],
            "packages": packages, "wall_s": wall_s, "lock": str(lock_file), "lock_written": wrote_lock,
            "lock_check": dataclasses.asdict(result.check) if result.check else None,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "finished_at": __import__("time").strftime("%Y-%m-%dT%H:%M:%S%z")}


def _build_table(report: dict):
    from rich.table import Table

    from carl.eval.report import add_columns

    title = (f"suite {report['suite']}: its smoke subset alone, {report['smoke']} tasks" if report["smoke_only"]
             else f"suite {report['suite']}: {report['tasks']} tasks, {report['smoke']} smoke")
    table = Table(title=title)
    add_columns(table, ("package", "status", "built", "kept", "smoke", "wall s"), "package")
    for p in report["packages"]:
        table.add_row(p["name"] + (f"=={p['version']}" if p["version"] else ""), p["status"], str(p["built"]),
                      str(p["kept"]), str(p["smoke"]), f"{p['wall_s']:.0f}")
    return table


def _strata_lines(report: dict, config) -> list[str]:
    """One line a stratum: its values in reading order, with their task counts."""
    from carl.eval.strata import order_values

    return [f"  {s}: " + ", ".join(f"{v} {rows[v]}" for v in order_values(s, set(rows), config.strata))
            for s, rows in report["strata"].items() if isinstance(rows, dict)]
