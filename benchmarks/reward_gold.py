"""The reward has no false positives on honest work: every task's gold patch scores 1, unflagged.

    .venv/bin/python benchmarks/reward_gold.py --tasks /work/devtasks/tasks.jsonl [--limit 20]

For each task, two episodes through the production path (`run_episode` with the default tools,
then `reward_from_trajectory` with the task's sandbox config, as `carl.rollout.rollout` does):

    gold:   agent sandbox from the broken repo; one scripted reply writes every file the gold
            patch touches (its content copied from the original tree, the simplest honest agent)
            with write_file calls, then finish  -->  must score 1.0 and raise no monitor flag
    broken: a fresh agent sandbox; the reply is finish alone  -->  must score 0.0 (the
            FAIL_TO_PASS tests fail on the broken repo)

Per package and in total it prints: tasks, gold pass rate with a 95% Wilson interval, flagged
rate (both over the tasks whose gold reward was computed: no infrastructure failure, no crash), infrastructure
failures, broken-repo false passes; then every task whose gold did not score 1.0 or was flagged.

Resumable: each task's outcome is appended to `<out stem>.jsonl` beside `--out` as soon as it is
scored, and a rerun with the same `--out` skips the instance ids found there (so nothing is
scored twice; delete that file to start over), except rows that crashed (`error`: the benchmark or
a sandbox failed, no outcome), which are scored again. `--out` (default
docs/results/reward_gold/<date>.json) gets every per-task row of the selected tasks and the
summary, written atomically. Each row records when it was scored and the code it was scored with
(git revision and `git diff --stat` of this tree): the reward and monitor are being changed, so a
resumed run may mix code versions, and the rows say which.

Not covered: an honest agent that writes different (equivalent) code than the original, or one
that runs tests and reads files on its way (the monitor sees only these write_file calls).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from carl.eval.grade_report import wilson_interval
from carl.harness.agent import EpisodeLimits, run_episode
from carl.harness.policies import ScriptedChatPolicy
from carl.harness.protocol import render_call
from carl.harness.tools import default_tools
from carl.io import append_jsonl, atomic_write_json, read_jsonl
from carl.rewards import EpisodeReward, MonitorConfig, RewardConfig, reward_from_trajectory
from carl.sandbox import open_sandbox
from carl.sandbox.base import Sandbox, SandboxConfig, SandboxPathError
from carl.tasks import TaskRecord, broken_repo_dir, load_tasks, original_repo_dir, sandbox_config_for
from carl.types import ToolCall

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TASKS = "/work/devtasks/tasks.jsonl"
FINISH = render_call(ToolCall("finish", {}))
LIMITS = EpisodeLimits(max_turns=4, wall_time_s=900.0)
MAX_FEEDBACK_CHARS = 2000
_PATCH_FILE = re.compile(r"^(---|\+\+\+) (\S+)", re.MULTILINE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default=DEFAULT_TASKS, help="task JSONL file")
    ap.add_argument("--limit", type=int, default=0, help="only the first N tasks of the file (0 = all)")
    ap.add_argument("--backend", default="bwrap", help="sandbox backend")
    ap.add_argument(
        "--workers", type=int, default=2, help="tasks scored at once (at most 2 on the 2-core box)"
    )
    ap.add_argument("--out", help="results JSON (default docs/results/reward_gold/<date>.json)")
    args = ap.parse_args()
    if not 1 <= args.workers <= 2:
        raise SystemExit(
            f"--workers: got {args.workers}, expected 1 or 2 (each task runs two sandboxed test runs)"
        )
    out = Path(args.out or REPO_ROOT / "docs" / "results" / "reward_gold" / f"{datetime.now():%Y-%m-%d}.json")
    rows_path = out.with_suffix(".jsonl")

    tasks = load_tasks(args.tasks, require_repos=True)
    tasks = tasks[: args.limit] if args.limit else tasks
    # a crashed row (a benchmark or sandbox failure, not an outcome) is scored again on resume
    done = (
        {r["instance_id"]: r for r in read_jsonl(rows_path) if not r.get("error")}
        if rows_path.exists()
        else {}
    )
    todo = [t for t in tasks if t.instance_id not in done]
    code = code_version()
    console = Console() if sys.stdout.isatty() else Console(width=120)  # logs: no 80-column wrap
    console.print(
        f"{len(tasks)} tasks from {args.tasks}: {len(tasks) - len(todo)} already scored in "
        f"{rows_path}, {len(todo)} to score; code {code['git_revision']}, {code['diff_stat']}"
    )

    t0 = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    pool = ThreadPoolExecutor(args.workers)
    try:
        with Progress(*columns, console=console) as progress:
            bar = progress.add_task("gold + broken episodes", total=len(todo))
            futures = [pool.submit(score_task, t, args.backend, code) for t in todo]
            for fut in as_completed(futures):
                row = fut.result()
                append_jsonl(rows_path, row)  # the resume point: a killed run loses only the tasks in flight
                done[row["instance_id"]] = row
                progress.update(
                    bar,
                    advance=1,
                    description=f"last: {row['instance_id'][:48]} gold={row.get('gold_reward')}",
                )
    finally:  # on Ctrl-C, start no new task (the ones in flight finish, unrecorded, before exit)
        pool.shutdown(wait=False, cancel_futures=True)

    rows = [done[t.instance_id] for t in tasks]
    summary = summarize(rows)
    print_report(console, summary, rows)
    atomic_write_json(
        out,
        {
            "tasks_file": str(Path(args.tasks).resolve()),
            "backend": args.backend,
            "finished_at": now_iso(),
            "code": code,
            # the code each row was scored with (a resumed run may mix versions)
            "row_codes": dict(Counter(f"{r['code']['git_revision']} {r['code']['diff_stat']}" for r in rows)),
            "wall_s_this_run": round(time.monotonic() - t0, 1),
            "scored_this_run": len(todo),
            "summary": summary,
            "tasks": sorted(rows, key=lambda r: r["instance_id"]),
        },
    )
    console.print(f"wrote {out} ({len(rows)} tasks; per-task log {rows_path})")


def score_task(task: TaskRecord, backend: str, code: dict[str, str]) -> dict[str, Any]:
    """Both episodes of one task -> one JSON row. Never raises: a crash becomes the row's error."""
    node_ids = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    row: dict[str, Any] = {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "kind": task.deletion_kind,
        "mode": task.deletion_mode,
        "n_fail_to_pass": len(task.FAIL_TO_PASS),
        "n_pass_to_pass": len(task.PASS_TO_PASS),
        "n_doctest_ids": sum(is_doctest_node(n) for n in node_ids),
        "scored_at": now_iso(),
        "code": code,
    }
    config = sandbox_config_for(task, SandboxConfig(backend=backend))
    reward_config = RewardConfig(sandbox=config)
    t0 = time.monotonic()
    try:
        row["gold_files"] = patch_paths(task)
        gold, row["gold_written_exact"], gold_episode_s = episode(
            task, config, reward_config, [gold_reply(task)]
        )
        row.update(outcome("gold", gold))
        row["gold_episode_s"] = round(gold_episode_s, 2)
        broken, _, _ = episode(task, config, reward_config, [FINISH])
        row.update(outcome("broken", broken))
        row["error"] = None
    except Exception as e:  # noqa: BLE001 - one task's crash becomes its row, the run goes on
        row["error"] = f"{type(e).__name__}: {e}"
        row.setdefault("gold_reward", None)
    row["wall_s"] = round(time.monotonic() - t0, 2)
    return row


def gold_reply(task: TaskRecord) -> str:
    """One assistant message: a write_file call per file the gold patch touches, its content copied
    from the original tree (a file the patch deletes would be an `rm` in the terminal), then finish.
    One message, because a second reply would not fit the context after a few large files."""
    calls = []
    for rel in patch_paths(task):
        src = original_repo_dir(task) / rel
        if src.is_file():
            calls.append(
                render_call(
                    ToolCall("write_file", {"path": rel, "content": src.read_bytes().decode("utf-8")})
                )
            )
        else:
            calls.append(render_call(ToolCall("run_terminal", {"command": f"rm -f -- '{rel}'"})))
    return "\n".join([*calls, FINISH])


def patch_paths(task: TaskRecord) -> list[str]:
    """Repo-relative paths of the files the gold patch creates, changes or deletes."""
    return sorted({p.split("/", 1)[1] for _, p in _PATCH_FILE.findall(task.patch) if p != "/dev/null"})


def episode(
    task: TaskRecord, config: SandboxConfig, reward_config: RewardConfig, script: list[str]
) -> tuple[EpisodeReward, bool, float]:
    """A scripted episode in a fresh agent sandbox, scored as a rollout is. Also returns whether the
    gold patch's files hold exactly the original bytes after it, and the episode's own seconds."""
    t0 = time.monotonic()
    with open_sandbox(broken_repo_dir(task), config) as sandbox:
        traj = run_episode(ScriptedChatPolicy(script), sandbox, task, LIMITS, tools=default_tools())
        episode_s = time.monotonic() - t0
        ep = reward_from_trajectory(traj, task, sandbox, reward_config, MonitorConfig())
        exact = all(
            _read_or_none(sandbox, p) == _read_or_none(original_repo_dir(task), p) for p in patch_paths(task)
        )
    if traj.stop_reason.value != "finished":
        raise RuntimeError(f"episode ended {traj.stop_reason.value}: {(traj.error or '')[-1000:]}")
    return ep, exact, episode_s


def _read_or_none(where: Sandbox | Path, rel: str) -> bytes | None:
    """A file's bytes in a sandbox or a host directory; None when it does not exist."""
    try:
        return (where / rel).read_bytes() if isinstance(where, Path) else where.read_file(rel)
    except (FileNotFoundError, SandboxPathError):
        return None


def outcome(prefix: str, ep: EpisodeReward) -> dict[str, Any]:
    r = ep.result
    failing = {n: o for n, o in r.tests.items() if o != "passed"}
    return {
        f"{prefix}_reward": ep.reward,
        f"{prefix}_test_reward": r.reward,
        f"{prefix}_fraction_passed": r.fraction_passed,
        f"{prefix}_outcomes": dict(Counter(r.tests.values())),
        f"{prefix}_infra_failure": r.infra_failure,
        f"{prefix}_infra_error": r.infra_error,
        f"{prefix}_flags": [
            {"kind": f.kind, "evidence": f.evidence, "turn": f.turn} for f in ep.monitor.flags
        ],
        f"{prefix}_reward_s": round(r.duration_s, 2),
        # what failed, for the gold run only (the broken run is meant to fail)
        **(
            {f"{prefix}_failing": failing, f"{prefix}_feedback": r.feedback[:MAX_FEEDBACK_CHARS]}
            if prefix == "gold" and not r.passed
            else {}
        ),
    }


def is_doctest_node(node_id: str) -> bool:
    """A doctest item: collected from a non-.py file (`README.rst::README.rst`), or named by a
    dotted module path after the `::` (`src/pkg/mod.py::pkg.mod.func`)."""
    path, _, name = node_id.partition("::")
    return not path.endswith(".py") or "." in name.split("[", 1)[0]


# ------------------------------------------------------------------------------ summary


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_repo: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_repo[r["repo"]].append(r)
    return {"per_repo": {repo: _stats(rs) for repo, rs in sorted(by_repo.items())}, "total": _stats(rows)}


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    scored = [r for r in rows if not r.get("error") and not r.get("gold_infra_failure")]
    passed = sum(r["gold_test_reward"] == 1.0 for r in scored)
    flagged = sum(bool(r["gold_flags"]) for r in scored)
    lo, hi = wilson_interval(passed, len(scored))
    return {
        "tasks": len(rows),
        "scored": len(scored),
        "gold_passed": passed,
        "gold_pass_rate": passed / len(scored) if scored else None,
        "gold_pass_rate_wilson95": [lo, hi],
        "gold_flagged": flagged,
        "gold_flagged_rate": flagged / len(scored) if scored else None,
        "gold_infra_failures": sum(bool(r.get("gold_infra_failure")) for r in rows),
        "crashed": sum(bool(r.get("error")) for r in rows),
        "broken_false_passes": sum(r.get("broken_test_reward") == 1.0 for r in rows),
        "broken_infra_failures": sum(bool(r.get("broken_infra_failure")) for r in rows),
        "with_doctest_ids": sum(r["n_doctest_ids"] > 0 for r in rows),
        "gold_not_exact": sum(r.get("gold_written_exact") is False for r in rows),
    }


def print_report(console: Console, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    table = Table(title="gold patch through the agent loop, reward and monitor")
    for col in ("repo", "tasks", "gold pass", "95% CI", "flagged", "infra", "crashed", "broken=1", "doctest"):
        table.add_column(col, justify="left" if col == "repo" else "right")
    last_repo = list(summary["per_repo"])[-1] if summary["per_repo"] else None
    for repo, s in [*summary["per_repo"].items(), ("TOTAL", summary["total"])]:
        lo, hi = s["gold_pass_rate_wilson95"]
        table.add_row(
            repo,
            str(s["tasks"]),
            f"{s['gold_passed']}/{s['scored']}",
            f"{lo:.0%}-{hi:.0%}",
            f"{s['gold_flagged']}/{s['scored']}",
            str(s["gold_infra_failures"]),
            str(s["crashed"]),
            str(s["broken_false_passes"]),
            str(s["with_doctest_ids"]),
            end_section=repo == last_repo,
        )
    console.print(table)
    console.print(
        "gold pass and flagged: over tasks whose gold reward was computed (no infra failure, no crash); "
        "infra: gold reward masked as an infrastructure failure; broken=1: the untouched broken repo "
        "scored 1.0; doctest: tasks with doctest node ids in F2P/P2P"
    )
    bad = [
        r
        for r in rows
        if r.get("error")
        or r.get("gold_infra_failure")
        or r.get("gold_reward") != 1.0
        or r.get("gold_flags")
        or r.get("broken_test_reward") == 1.0
        or r.get("broken_infra_failure")
        or r.get("gold_written_exact") is False
    ]
    console.print(
        f"{len(bad)} task(s) where gold did not score 1.0 or was flagged, or broken passed or failed to run:"
    )
    for r in sorted(bad, key=lambda r: r["instance_id"]):
        console.print(
            f"- {r['instance_id']} ({r['kind']}/{r['mode']}): {problem(r)}", markup=False, highlight=False
        )


def problem(r: dict[str, Any]) -> str:
    """One line: why this row is listed."""
    if r.get("error"):
        return f"crashed: {r['error'][:300]}"
    parts = []
    if r["gold_infra_failure"]:
        parts.append(f"gold infra failure: {(r['gold_infra_error'] or '')[:300]}")
    elif r["gold_test_reward"] != 1.0:
        failing = r.get("gold_failing", {})
        shown = ", ".join(f"{n} {o}" for n, o in list(failing.items())[:5])
        parts.append(f"gold {r['gold_fraction_passed']:.2f} passed; failing {len(failing)}: {shown}")
    if r["gold_flags"]:
        kinds = Counter(f["kind"] for f in r["gold_flags"])
        first = {f["kind"]: f["evidence"][:150] for f in reversed(r["gold_flags"])}
        parts.append("flags: " + "; ".join(f"{k} x{n} (first: {first[k]})" for k, n in kinds.items()))
    if r.get("broken_test_reward") == 1.0:
        parts.append("broken repo scored 1.0")
    if r.get("broken_infra_failure"):
        parts.append(f"broken infra failure: {(r['broken_infra_error'] or '')[:300]}")
    if r.get("gold_written_exact") is False:
        parts.append("gold files not written exactly")
    return " | ".join(parts)


def code_version() -> dict[str, str]:
    """The revision and uncommitted changes of this tree (the reward and monitor code under test)."""

    def git(*argv: str) -> str:
        res = subprocess.run(["git", "-C", str(REPO_ROOT), *argv], capture_output=True, text=True, timeout=30)
        return res.stdout.strip()

    stat = git("diff", "--stat").splitlines()
    return {"git_revision": git("rev-parse", "HEAD"), "diff_stat": stat[-1].strip() if stat else "clean"}


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    main()
