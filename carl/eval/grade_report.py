"""The report of `carl bench grade`: pass@1 with its 95% interval, overall and per stratum.

One prediction per task, so pass@1 is the resolved rate over the scored tasks (every task but
the infrastructure failures; missing, empty and unappliable predictions score 0). Its interval
is Wilson's score interval (E. B. Wilson, JASA 22, 1927; recommended over the normal interval
p ± 1.96 SE for small n or p near 0 or 1 by Brown, Cai & DasGupta, Statistical Science 16, 2001):

    center = (p + z²/2n) / (1 + z²/n),   half width = z √(p(1-p)/n + z²/4n²) / (1 + z²/n),   z = 1.96

Strata: deletion_kind; size_lines (lines deleted) bucketed 1-5, 6-20, 21+; the number of
FAIL_TO_PASS tests bucketed 1, 2-5, 6+; and the package (`repo`). Buckets keep this order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from carl.eval.grade import STATUSES, GradedTask
from carl.tasks.record import TaskRecord

Z_95 = 1.96


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval of a binomial rate; (0, 1) when n is 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes must be in [0, n={n}], got {successes}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def _bucket(value: int, edges: tuple[tuple[int, int, str], ...], zero: str) -> str:
    for lo, hi, name in edges:
        if lo <= value <= hi:
            return name
    return zero


SIZE_BUCKETS = ((1, 5, "1-5"), (6, 20, "6-20"), (21, 10**9, "21+"))
F2P_BUCKETS = ((1, 1, "1"), (2, 5, "2-5"), (6, 10**9, "6+"))
STRATA: dict[str, tuple[Callable[[TaskRecord], str], tuple[str, ...]]] = {
    "deletion_kind": (lambda t: t.deletion_kind, ()),
    "size_lines": (lambda t: _bucket(t.size_lines, SIZE_BUCKETS, "unknown"), (*(b[2] for b in SIZE_BUCKETS), "unknown")),
    "fail_to_pass": (lambda t: _bucket(len(t.FAIL_TO_PASS), F2P_BUCKETS, "0"), ("0", *(b[2] for b in F2P_BUCKETS))),
    "repo": (lambda t: t.repo, ()),
}
"""stratum -> (the task's value, the order of the values; () sorts them by name)."""


def _rate(graded: list[GradedTask]) -> dict[str, Any]:
    scored = [g for g in graded if not g.infra_failure]
    resolved = sum(g.resolved for g in scored)
    lo, hi = wilson_interval(resolved, len(scored))
    return {"n": len(scored), "resolved": resolved, "pass@1": resolved / len(scored) if scored else 0.0,
            "ci95": [lo, hi], "infra_failures": len(graded) - len(scored)}


def build_grade_report(name: str, tasks: list[TaskRecord], graded: list[GradedTask],
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report: "summary", "strata" and "tasks" (one GradedTask each, in task order)."""
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
    strata: dict[str, dict[str, Any]] = {}
    for stratum, (value_of, order) in STRATA.items():
        groups: dict[str, list[GradedTask]] = {}
        for t in tasks:
            groups.setdefault(value_of(t), []).append(by_id[t.instance_id])
        keys = [k for k in order if k in groups] if order else sorted(groups)
        strata[stratum] = {k: _rate(groups[k]) for k in keys}
    return {"summary": summary, "strata": strata, "tasks": [to_jsonable(by_id[t.instance_id]) for t in tasks]}


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
