"""The report of `carl bench grade`: pass@1 with its 95% interval, overall and per stratum.

One prediction per task, so pass@1 is the resolved rate over the scored tasks (every task but
the infrastructure failures; missing, empty and unappliable predictions score 0). Its interval
is Wilson's score interval (`carl.eval.strata`, where the formula and its references are).

Strata (`carl.eval.strata.task_strata`): deletion_kind; size_lines (lines deleted) bucketed
1-5, 6-20, 21+; size_files (files touched) 1, 2+; the number of FAIL_TO_PASS tests bucketed
1, 2-5, 6+; and the package (`repo`). A suite's own edges replace these. Buckets keep this order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from carl.eval.grade import STATUSES, GradedTask
from carl.eval.strata import STRATA, StrataConfig, order_values, task_strata, wilson_interval
from carl.tasks.record import TaskRecord


def _rate(graded: list[GradedTask]) -> dict[str, Any]:
    scored = [g for g in graded if not g.infra_failure]
    resolved = sum(g.resolved for g in scored)
    lo, hi = wilson_interval(resolved, len(scored))
    return {"n": len(scored), "resolved": resolved, "pass@1": resolved / len(scored) if scored else 0.0,
            "ci95": [lo, hi], "infra_failures": len(graded) - len(scored)}


def build_grade_report(name: str, tasks: list[TaskRecord], graded: list[GradedTask],
                       extra: dict[str, Any] | None = None,
                       strata: StrataConfig = StrataConfig()) -> dict[str, Any]:
    """The JSON report: "kind" ("grade"), "summary", "strata" and "tasks" (one GradedTask each,
    in task order)."""
    from carl.types import to_jsonable

    by_id = {g.instance_id: g for g in graded}
    statuses = Counter(g.status for g in graded)
    flags = Counter(k for g in graded for k in g.monitor_flags)
    summary = {
        "name": name,
        "num_tasks": len(tasks),
        **_rate(graded),
        "ci95_method": "wilson",
        "statuses": {s: statuses.get(s, 0) for s in STATUSES},
        "flagged": sum(bool(g.monitor_flags) for g in graded),
        "monitor_flags": dict(flags.most_common()),
        **(extra or {}),
    }
    values = {t.instance_id: task_strata(t, strata) for t in tasks}
    rows: dict[str, dict[str, Any]] = {}
    for stratum in STRATA:
        groups: dict[str, list[GradedTask]] = {}
        for t in tasks:
            groups.setdefault(values[t.instance_id][stratum], []).append(by_id[t.instance_id])
        rows[stratum] = {k: _rate(groups[k]) for k in order_values(stratum, set(groups), strata)}
    return {"kind": "grade", "summary": summary, "strata": rows,
            "tasks": [{**to_jsonable(by_id[t.instance_id]), "repo": t.repo} for t in tasks]}


def render_grade_table(report: dict[str, Any]):
    """A rich Table: pass@1 and its interval per stratum value, the overall row first."""
    from rich.table import Table

    from carl.eval.report import add_columns

    s = report["summary"]
    lo, hi = s["ci95"]
    table = Table(title=f"{s['name']}: pass@1 {s['pass@1']:.3f} [{lo:.3f}, {hi:.3f}] "
                        f"({s['resolved']}/{s['n']} resolved)")
    add_columns(table, ("stratum", "n", "resolved", "pass@1", "95% CI"), "stratum")
    for stratum, rows in report["strata"].items():
        for value, r in rows.items():
            table.add_row(f"{stratum}={value}", str(r["n"]), str(r["resolved"]), f"{r['pass@1']:.2f}",
                          f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}")
    counts = ", ".join(f"{n} {status}" for status, n in s["statuses"].items() if n)
    flags = ", ".join(f"{n} {k}" for k, n in s["monitor_flags"].items()) or "none"
    table.caption = f"{counts}; monitor flags: {flags}; 95% CI: Wilson score interval"
    return table
