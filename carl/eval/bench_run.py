"""`carl bench run`: a carl checkpoint or any OpenAI-compatible endpoint scored on a suite through
carl's harness (carl.eval.bench.run_samples, the path `carl eval` and RL's own evals take), with
the samples kept as they finish so that a killed run continues where it stopped.

    suite tasks x n --run_samples (skip the samples in OUT.partial.jsonl)--> each new sample
        appended to OUT.partial.jsonl as it finishes (one line, fsynced)
    all samples --> carl.eval.report.build_report (pass@1, pass@k, tokens, tool calls, wall time)
        --> build_run_report: intervals, strata, packages, cost --> OUT (JSON)

Every line of the partial file carries the run's key, a hash of what decides its samples (the
agent, its sampling and limits, the tools, the sandbox backend, the suite's lock and subset): a
rerun reuses the lines of its own key only, and refuses a file holding another run's. A sample
whose infrastructure failed is run again; any other is never scored twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from carl.errors import UserError
from carl.eval.report import Sample, build_report
from carl.eval.strata import STRATA, StrataConfig, mean_interval, order_values, task_strata
from carl.tasks.record import TaskRecord


@dataclass(frozen=True)
class Price:
    """An API model's price, for cost per task."""

    input_usd_per_mtok: float
    """US dollars per million input (prompt) tokens."""
    output_usd_per_mtok: float
    """US dollars per million output (generated) tokens."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value >= 0:
                raise ValueError(f"{f.name}: got {value}, expected a price >= 0 (US dollars per million tokens)")

    def cost(self, input_tokens: float, output_tokens: float) -> float:
        return (input_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok) / 1e6


def run_key(settings: Mapping[str, Any]) -> str:
    """16 hex digits naming a run's settings (see the module docstring)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def load_partial_samples(path: str | Path, key: str) -> dict[tuple[str, int], Sample]:
    """(task id, sample index) -> the last sample recorded for it by the run `key`, infrastructure
    failures left out (they run again). UserError for a file of another run or a garbled line."""
    from carl.io import read_jsonl_numbered

    path = Path(path)
    if not path.is_file():
        return {}
    out: dict[tuple[str, int], Sample] = {}
    names = {f.name for f in fields(Sample)}
    try:
        for lineno, d in read_jsonl_numbered(path):
            if not isinstance(d, dict) or "run_key" not in d:
                raise ValueError(f"line {lineno}: expected a sample with its run_key")
            if d["run_key"] != key:
                raise UserError(f"partial results {str(path)!r}: line {lineno} is a sample of another run (key "
                                f"{d['run_key']}, this run's is {key}: another agent, suite, sampling or limits); "
                                "expected this run's samples only: choose another --out, or delete the file")
            s = Sample(**{k: v for k, v in d.items() if k in names})
            out.pop((s.task_id, s.sample), None)
            if not s.infra_failure:
                out[s.task_id, s.sample] = s
    except (ValueError, TypeError) as e:
        raise UserError(f"partial results {str(path)!r}: {e}; expected the lines an earlier `carl bench run` wrote "
                        "(delete the file to run every sample again)") from None
    return out


def build_run_report(name: str, tasks: list[TaskRecord], samples: list[Sample], k: int,
                     strata: StrataConfig = StrataConfig(), price: Price | None = None,
                     extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON result: "kind" ("run"), "summary", "strata", "tasks" (docs/bench.md, "Results")."""
    order = {t.instance_id: i for i, t in enumerate(tasks)}
    samples = sorted(samples, key=lambda s: (order[s.task_id], s.sample))
    report = build_report(name, samples, k)
    by_id = {r.task_id: r for r in report.tasks}
    rows = []
    for t in tasks:
        r = by_id.get(t.instance_id)
        row = _to_dict(r) if r is not None else {"task_id": t.instance_id, "n": 0, "outcomes": ""}
        row["repo"] = t.repo
        row["cost_usd"] = price.cost(r.mean_input_tokens, r.mean_tokens) if price and r and r.n else None
        rows.append(row)
    summary = report.summary()
    summary["pass@k"] = summary.pop(f"pass@{k}") if k != 1 else summary["pass@1"]
    scored = [r for r in report.tasks if r.n > 0]
    summary.update(_rates(scored, k))
    summary.update({
        "num_tasks": len(tasks), "samples_per_task": k, "ci95_method": "wilson-clustered",
        "samples": sum(r.n for r in report.tasks), "passed": sum(r.passed for r in report.tasks),
        "flagged": sum(sum(r.monitor_flags.values()) > 0 for r in scored),
        "tokens_counted": all(r.tokens_counted for r in scored),
        "price": {"input_usd_per_mtok": price.input_usd_per_mtok,
                  "output_usd_per_mtok": price.output_usd_per_mtok} if price else None,
        "cost_per_task_usd": _mean([row["cost_usd"] for row in rows if row["cost_usd"] is not None]) if price else None,
        "total_cost_usd": sum(price.cost(s.input_tokens, s.generated_tokens) for s in samples) if price else None,
        **(extra or {}),
    })
    values = {t.instance_id: task_strata(t, strata) for t in tasks}
    table: dict[str, dict[str, Any]] = {}
    for stratum in STRATA:
        groups: dict[str, list] = {}
        for t in tasks:
            groups.setdefault(values[t.instance_id][stratum], []).append(by_id.get(t.instance_id))
        table[stratum] = {v: _rates([r for r in groups[v] if r is not None and r.n > 0], k,
                                    unscored=sum(r is None or r.n == 0 for r in groups[v]))
                          for v in order_values(stratum, set(groups), strata)}
    return {"kind": "run", "summary": summary, "strata": table, "tasks": rows}


def _rates(scored: list, k: int, unscored: int | None = None) -> dict[str, Any]:
    """pass@1 and pass@k over tasks with scored samples, and their intervals (carl.eval.strata)."""
    p1 = [r.pass_at_1 for r in scored]
    pk = [r.pass_at_k for r in scored]
    out = {"n": len(scored), "pass@1": _mean(p1), "ci95": list(mean_interval(p1, sum(r.n for r in scored))),
           "pass@k": _mean(pk), "ci95_pass@k": list(mean_interval(pk, sum(max(1, r.n // k) for r in scored)))}
    if unscored is not None:
        out.update(samples=sum(r.n for r in scored), passed=sum(r.passed for r in scored), unscored_tasks=unscored)
    return out


def _to_dict(r) -> dict[str, Any]:
    from carl.types import to_jsonable

    return to_jsonable(r)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def render_run_table(report: dict[str, Any]):
    """A rich Table: pass@1 and pass@k with their intervals per stratum value."""
    from rich.table import Table

    from carl.eval.report import add_columns

    s = report["summary"]
    k = s["samples_per_task"]
    lo, hi = s["ci95"]
    at_k = f", pass@{k} {s['pass@k']:.3f}" if k > 1 else ""
    table = Table(title=f"{s['name']}: pass@1 {s['pass@1']:.3f} [{lo:.3f}, {hi:.3f}]{at_k} over {s['n']} tasks x {k}")
    add_columns(table, ("stratum", "n", "pass@1", "95% CI", *((f"pass@{k}",) if k > 1 else ())), "stratum")
    for stratum, rows in report["strata"].items():
        for value, r in rows.items():
            table.add_row(f"{stratum}={value}", str(r["n"]), f"{r['pass@1']:.2f}",
                          f"{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}", *((f"{r['pass@k']:.2f}",) if k > 1 else ()))
    cost = f"${s['cost_per_task_usd']:.4f} a task" if s["cost_per_task_usd"] is not None else "no price set"
    flags = ", ".join(f"{n} {kind}" for kind, n in s["monitor_flags"].items()) or "none"
    table.caption = (f"tokens a task: {s['input_tokens_per_task']:.0f} in, {s['tokens_per_task']:.0f} out; "
                     f"{s['tool_calls_per_task']:.1f} tool calls; {s['wall_s_per_task']:.1f} s; {cost}; "
                     f"monitor flags: {flags}; {s['infra_failures']} samples not scored (infrastructure)")
    return table
