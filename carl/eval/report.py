"""Benchmark reports: pass@1 and pass@k per task and overall, tokens and tool calls per task,
wall time per task; rendered as a rich table and written as JSON.

pass@k uses the unbiased estimator of Chen et al. 2021 (Codex, arXiv 2107.03374):
    pass@k = 1 - C(n - c, k) / C(n, k)   for n samples of which c passed.
Samples whose infrastructure failed are excluded from n (they say nothing about the policy).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    if n <= 0:
        raise ValueError(f"pass_at_k: n must be positive, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, n={n}], got {c}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Sample:
    """One evaluated episode."""

    task_id: str
    passed: bool
    reward: float
    generated_tokens: int
    tool_calls: int
    tool_errors: int
    wall_s: float
    infra_failure: bool = False
    stop_reason: str = ""
    error: str = ""  # why its infrastructure failed (one line), when it did
    digest: str = ""  # a hash of what the policy wrote: equal digests, identical episodes
    sample: int = 0  # its index j among its task's samples (it sampled from the streams "<task id>/j")
    input_tokens: int = 0  # the tokens its generations were prompted with, summed (carl.eval.bench)
    tokens_counted: bool = True  # False: a chat endpoint that reported no token counts (both are 0)
    monitor_flags: list[str] = field(default_factory=list)  # kinds of the monitor's flags
    context_resets: int = 0  # self-summaries or truncations of its context (carl.harness.agent)


@dataclass
class TaskReport:
    task_id: str
    n: int
    passed: int
    pass_at_1: float
    pass_at_k: float
    mean_tokens: float
    mean_tool_calls: float
    mean_wall_s: float
    infra_failures: int
    finish_rate: float = 0.0  # episodes that ended with a finish call (not the turn, token or time limit)
    stop_reasons: dict[str, int] = field(default_factory=dict)  # why its scored episodes ended, counted
    infra_errors: dict[str, int] = field(default_factory=dict)  # why its unscored ones failed, counted
    outcomes: str = ""  # per sample in sample order: "1" passed, "0" failed, "x" infrastructure failure
    digests: list[str] = field(default_factory=list)  # per sample in sample order (Sample.digest)
    mean_input_tokens: float = 0.0  # tokens prompted per sample (mean_tokens: generated per sample)
    tokens_counted: bool = True  # every scored sample's tokens were counted
    monitor_flags: dict[str, int] = field(default_factory=dict)  # flag kind -> scored samples flagged
    mean_context_resets: float = 0.0  # context resets (summaries or truncations) per scored sample
    finished: str = ""  # per sample in sample order, as outcomes: "1" called finish, "0" did not, "x" infrastructure


@dataclass
class BenchReport:
    name: str
    k: int
    tasks: list[TaskReport] = field(default_factory=list)

    @property
    def pass_at_1(self) -> float:
        scored = [t for t in self.tasks if t.n > 0]
        return sum(t.pass_at_1 for t in scored) / len(scored) if scored else 0.0

    @property
    def pass_at_k(self) -> float:
        scored = [t for t in self.tasks if t.n > 0]
        return sum(t.pass_at_k for t in scored) / len(scored) if scored else 0.0

    def summary(self) -> dict[str, Any]:
        scored = [t for t in self.tasks if t.n > 0]

        def mean(attr: str) -> float:
            return sum(getattr(t, attr) for t in scored) / len(scored) if scored else 0.0

        return {
            "name": self.name,
            "num_tasks": len(self.tasks),
            "k": self.k,
            "pass@1": self.pass_at_1,
            f"pass@{self.k}": self.pass_at_k,
            "tokens_per_task": mean("mean_tokens"),
            "input_tokens_per_task": mean("mean_input_tokens"),
            "tool_calls_per_task": mean("mean_tool_calls"),
            "wall_s_per_task": mean("mean_wall_s"),
            "finish_rate": mean("finish_rate"),
            "context_resets_per_task": mean("mean_context_resets"),
            "passes_finished": self.passes_finished(),
            "infra_failures": sum(t.infra_failures for t in self.tasks),
            "stop_reasons": dict(sum((Counter(t.stop_reasons) for t in self.tasks), Counter())),
            "infra_errors": self.infra_errors(),
            "monitor_flags": dict(sum((Counter(t.monitor_flags) for t in self.tasks), Counter()).most_common()),
        }

    def passes_finished(self) -> float | None:
        """Of the samples that passed, the fraction that ended with a finish call: an agent that
        solves the task and then runs on to the turn limit never says it is done. None when no sample
        passed, or the report predates per-sample finish records."""
        pairs = [(o, f) for t in self.tasks if len(t.finished) == len(t.outcomes)
                 for o, f in zip(t.outcomes, t.finished) if o == "1"]
        return sum(f == "1" for _, f in pairs) / len(pairs) if pairs else None

    def infra_errors(self) -> dict[str, int]:
        """Why samples failed in the infrastructure, counted over all tasks, most common first."""
        return dict(sum((Counter(t.infra_errors) for t in self.tasks), Counter()).most_common())

    def to_dict(self) -> dict[str, Any]:
        from carl.types import to_jsonable

        return {"summary": self.summary(), "tasks": to_jsonable(self.tasks)}


def build_report(name: str, samples: list[Sample], k: int) -> BenchReport:
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)
    report = BenchReport(name=name, k=k)
    for task_id, group in by_task.items():
        ok = [s for s in group if not s.infra_failure]
        n, c = len(ok), sum(s.passed for s in ok)
        report.tasks.append(
            TaskReport(
                task_id=task_id,
                n=n,
                passed=c,
                pass_at_1=pass_at_k(n, c, 1) if n else 0.0,
                pass_at_k=pass_at_k(n, c, min(k, n)) if n else 0.0,
                mean_tokens=_mean([s.generated_tokens for s in ok]),
                mean_tool_calls=_mean([s.tool_calls for s in ok]),
                mean_wall_s=_mean([s.wall_s for s in ok]),
                infra_failures=len(group) - n,
                finish_rate=_mean([s.stop_reason == "finished" for s in ok]),
                stop_reasons=dict(Counter(s.stop_reason for s in ok)),
                infra_errors=dict(Counter(s.error for s in group if s.infra_failure)),
                outcomes="".join("x" if s.infra_failure else str(int(s.passed)) for s in group),
                digests=[s.digest for s in group],
                mean_input_tokens=_mean([s.input_tokens for s in ok]),
                tokens_counted=all(s.tokens_counted for s in ok),
                monitor_flags=dict(Counter(f for s in ok for f in s.monitor_flags)),
                mean_context_resets=_mean([s.context_resets for s in ok]),
                finished="".join("x" if s.infra_failure else str(int(s.stop_reason == "finished")) for s in group),
            )
        )
    return report


def render_table(report: BenchReport):
    """A rich Table of the per-task rows and the overall summary."""
    from rich.table import Table

    table = Table(title=f"{report.name}: pass@1 {report.pass_at_1:.3f}, pass@{report.k} {report.pass_at_k:.3f}")
    errors = report.infra_errors()
    if errors:  # unscored samples: say why under the table, the most common reasons first
        shown = "; ".join(f"{n}x {e}" for e, n in list(errors.items())[:3])
        table.caption = f"{sum(errors.values())} samples failed in the infrastructure and are not scored: {shown}"
    cols = ("task", "n", "passed", "pass@1", f"pass@{report.k}", "tokens", "calls", "done", "wall s")
    if errors:  # the column of unscored samples, when there are any (the caption says why)
        cols += ("infra",)
    add_columns(table, cols, "task")
    labels = short_task_ids([t.task_id for t in report.tasks])
    legend = "calls: tool calls per sample; done: fraction that called finish"
    if any(label != t.task_id for label, t in zip(labels, report.tasks)):
        legend += "\ntask: <repo>:<the last part of its id>"
    table.caption = "\n".join(filter(None, [table.caption, legend]))
    for label, t in zip(labels, report.tasks):
        row = [label, str(t.n), str(t.passed), f"{t.pass_at_1:.2f}", f"{t.pass_at_k:.2f}", f"{t.mean_tokens:.0f}",
               f"{t.mean_tool_calls:.1f}", f"{t.finish_rate:.2f}", f"{t.mean_wall_s:.1f}", str(t.infra_failures)]
        table.add_row(*row[:len(cols)])
    return table


def short_task_ids(task_ids: list[str], width: int = 24) -> list[str]:
    """Labels for task ids that fit a table's first column: `repo__rev-kind-mode-hash` (the task
    pipeline's ids) -> `repo:hash`, which tells the tasks apart and finds them in a report by grep.
    The ids as they are when all fit in `width`, or when any has another form or two labels clash."""
    if all(len(t) <= width for t in task_ids):
        return list(task_ids)
    labels = []
    for task_id in task_ids:
        repo, sep, rest = task_id.partition("__")
        if not (sep and repo and "-" in rest):
            return list(task_ids)
        labels.append(f"{repo}:{rest.rsplit('-', 1)[1]}")
    return labels if len(set(labels)) == len(labels) else list(task_ids)


def add_columns(table, cols, text_col: str) -> None:
    """Columns that stay readable in an 80-column terminal or a log: numbers keep their header's
    width, the text column (task ids, checkpoint names) wraps instead of ending in "…"."""
    from rich.box import SIMPLE_HEAD

    table.box, table.pad_edge, table.collapse_padding = SIMPLE_HEAD, False, True
    for col in cols:
        if col == text_col:
            table.add_column(col, justify="left", overflow="fold")
        else:
            table.add_column(col, justify="right", min_width=len(col), no_wrap=True)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
