"""`carl bench compare A B`: two results of the same tasks, paired, with the standard error of
their difference.

- Two `carl bench run` results (or `carl eval` reports): sample by sample, as `carl compare`
  does (carl.eval.paired.paired_difference): runs scored with one --seed share their random
  numbers, and the standard error counts the sampling noise of these tasks.
- Any other pair (two `carl bench grade` results, or a run against graded predictions: carl's
  harness against another agent's patches): task by task, paired by instance id
  (carl.eval.paired.paired_rates); the standard error counts the noise of the tasks as a
  sample of their kind, since one prediction per task cannot show the agent's own.

The comparison is JSON too (`--out`), and `--fail-if-worse` makes it a CI gate: exit 3 when B is
below A by more than 1.64 paired standard errors (one-sided, 95%), as the online gate decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from carl.errors import UserError

Z_WORSE = 1.64


def load_result(path: str | Path, which: str) -> dict[str, Any]:
    """A result JSON (`carl bench run`, `carl bench grade`, `carl eval`); UserError naming `which`."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{which}: {str(path)!r} is not a readable result ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("tasks"), list) or not isinstance(d.get("summary"), dict):
        raise UserError(f"{which}: {str(path)!r} has no 'summary' and 'tasks' (expected the JSON of carl bench run "
                        "--out, carl bench grade --out or carl eval --out)")
    try:
        result_kind(d)
    except ValueError as e:
        raise UserError(f"{which}: {str(path)!r}: {e}") from None
    return d


def result_kind(d: dict[str, Any]) -> str:
    """"run" (samples per task: a bench run or an eval report) or "grade" (one graded prediction per task)."""
    if d.get("kind") in ("run", "grade"):
        return d["kind"]
    first = d["tasks"][0] if d["tasks"] else {}
    if isinstance(first, dict) and "outcomes" in first:
        return "run"
    if isinstance(first, dict) and "status" in first:
        return "grade"
    raise ValueError("its tasks have neither 'outcomes' (a run) nor 'status' (a grade)")


def task_rates(d: dict[str, Any]) -> dict[str, float]:
    """Task id -> its pass rate over scored samples (a grade: 1.0 resolved, 0.0 not); tasks not
    scored (infrastructure failures only) are left out."""
    if result_kind(d) == "run":
        return {t["task_id"]: t["passed"] / t["n"] for t in d["tasks"] if t.get("n")}
    return {t["instance_id"]: float(t["resolved"]) for t in d["tasks"] if not t.get("infra_failure")}


def _shown(d: dict[str, Any]) -> dict[str, str]:
    """Task id -> its outcome as a table shows it: "2/4" passes of a run, a grade's status."""
    if result_kind(d) == "run":
        return {t["task_id"]: f"{t['passed']}/{t['n']}" for t in d["tasks"]}
    return {t["instance_id"]: t["status"] for t in d["tasks"]}


def compare_results(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The comparison of `b` with `a` (see the module docstring), as JSON."""
    from carl.eval.paired import paired_difference, paired_rates

    both_runs = result_kind(a) == result_kind(b) == "run"
    try:
        if both_runs:
            d = paired_difference(a, b)
        else:
            same = set()
            if result_kind(a) == result_kind(b) == "grade":
                sha = {t["instance_id"]: t.get("patch_sha256") for t in a["tasks"]}
                same = {t["instance_id"] for t in b["tasks"] if t.get("patch_sha256") and
                        sha.get(t["instance_id"]) == t["patch_sha256"]}
            d = paired_rates(task_rates(a), task_rates(b), same)
    except ValueError as e:
        raise UserError(str(e)) from None
    rates_a, rates_b = task_rates(a), task_rates(b)
    shown_a, shown_b = _shown(a), _shown(b)
    changed = [{"task": t, "a": shown_a[t], "b": shown_b[t]} for t in rates_a
               if t in rates_b and rates_a[t] != rates_b[t]]
    lock_a, lock_b = a["summary"].get("suite_lock_sha256"), b["summary"].get("suite_lock_sha256")
    return {
        "a": a["summary"].get("name", ""), "b": b["summary"].get("name", ""),
        "method": "samples" if both_runs else "tasks",
        "tasks": d.tasks, "pairs": d.pairs, "pass_a": d.pass_a, "pass_b": d.pass_b, "diff": d.diff,
        "se_paired": d.se_paired, "se_independent": d.se_independent,
        "z": d.diff / d.se_paired if d.se_paired > 0 else None,
        "identical": d.identical, "agree": d.agree, "tasks_better": d.tasks_better, "tasks_worse": d.tasks_worse,
        "only_in_a": sorted(set(rates_a) - set(rates_b)), "only_in_b": sorted(set(rates_b) - set(rates_a)),
        "same_suite": None if not (lock_a and lock_b) else lock_a == lock_b,
        "changed": changed,
    }


def worse(c: dict[str, Any]) -> bool:
    """B is below A by more than Z_WORSE paired standard errors (a fall of exactly that is noise)."""
    return c["diff"] < 0 and (c["se_paired"] == 0 or -c["diff"] / c["se_paired"] > Z_WORSE)


def render(c: dict[str, Any], console) -> None:
    from rich.table import Table

    from carl.eval.report import add_columns

    what = "passes / paired samples" if c["method"] == "samples" else "pass rate or status"
    table = Table(title=f"tasks whose outcome changed ({what})")
    add_columns(table, ("task", "a", "b"), "task")
    for row in c["changed"]:
        table.add_row(row["task"], row["a"], row["b"])
    console.print(table)
    noise = ("paired standard error of the samples; {:.3f} had the runs drawn independent random numbers"
             if c["method"] == "samples" else
             "paired standard error over tasks; {:.3f} unpaired").format(c["se_independent"])
    print(f"{c['a']} -> {c['b']}: pass@1 {c['pass_a']:.3f} -> {c['pass_b']:.3f}: {c['diff']:+.3f} ± "
          f"{c['se_paired']:.3f} ({noise}) over {c['tasks']} tasks and {c['pairs']} pairs; "
          f"{c['tasks_better']} tasks better, {c['tasks_worse']} worse; {c['identical']} identical, "
          f"{c['agree']} with the same outcome")
    if c["only_in_a"] or c["only_in_b"]:
        print(f"not compared: {len(c['only_in_a'])} tasks scored in A only, {len(c['only_in_b'])} in B only")
    if c["same_suite"] is False:
        print("note: the two results are of different suites (their lock files differ); only shared task ids are "
              "compared")
