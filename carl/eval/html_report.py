"""`carl bench report RESULTS.json --html OUT.html`: one self-contained HTML page of a result.

Works for `carl bench run` results (and `carl eval` reports) and `carl bench grade` results.
The page holds the headline numbers, plots (matplotlib, rendered to PNG and embedded as base64
data URIs) and tables; it loads nothing from anywhere (no scripts, stylesheets, fonts or images
outside the file), so it can be mailed, attached to a CI run or opened offline.

    pass@1 with its 95% interval per stratum (kind, lines to write, files touched, failing tests)
    pass@1 with its 95% interval per package
    run:   per task tokens in / out, tool calls, wall time, cost (when priced); stop reasons
    grade: outcome statuses; grading time per task
    monitor flags, when any; every task's row
"""

from __future__ import annotations

import base64
import html
import io
from typing import Any

from carl.eval.bench_compare import result_kind

_CSS = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3}td.n{text-align:right}h1{font-size:22px}h2{font-size:18px;margin-top:1.6em}
.big{font-size:20px}.muted{color:#777;font-size:12px}img{max-width:100%}"""


def render_html(result: dict[str, Any]) -> str:
    """The page for one result (see the module docstring)."""
    kind = result_kind(result)
    s = result["summary"]
    strata = result.get("strata") or {}
    parts = [f"<h1>{_e(s.get('name', ''))}: {'carl bench run' if kind == 'run' else 'carl bench grade'}</h1>",
             _headline(s, kind), _key_values(s, kind)]
    if strata:
        parts.append("<h2>pass@1 by stratum</h2>" + _img(_strata_plot(strata)))
        if "repo" in strata:
            parts.append("<h2>pass@1 by package</h2>" + _img(_rate_plot({"package": strata["repo"]})))
        parts.append(_strata_table(strata, kind))
    parts.append("<h2>per task</h2>" + _img(_cost_plot(result["tasks"], kind)))
    flags = s.get("monitor_flags") or {}
    parts.append("<h2>monitor flags</h2>" + (_counts_table(flags, "flag", "count") if flags else
                                              "<p>none: the reward-hacking monitor flagged nothing.</p>"))
    parts.append("<h2>tasks</h2>" + _tasks_table(result["tasks"], kind))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + _e(str(s.get("name", "carl bench")))
            + f"</title><style>{_CSS}</style></head><body>" + "\n".join(parts) + "</body></html>\n")


def _headline(s: dict[str, Any], kind: str) -> str:
    lo, hi = s.get("ci95") or (0.0, 1.0)
    line = f"pass@1 <b>{s['pass@1']:.3f}</b> [{lo:.3f}, {hi:.3f}] (95%)"
    if kind == "run" and "pass@k" in s:
        klo, khi = s.get("ci95_pass@k") or (0.0, 1.0)
        line += f", pass@{s.get('samples_per_task', s.get('k'))} <b>{s['pass@k']:.3f}</b> [{klo:.3f}, {khi:.3f}]"
    elif kind == "grade":
        line += f": {s['resolved']} of {s['n']} tasks resolved"
    return f"<p class='big'>{line}</p>"


def _key_values(s: dict[str, Any], kind: str) -> str:
    keys = (("suite", "suite"), ("num_tasks", "tasks"), ("n", "tasks scored"), ("samples_per_task", "samples a task"),
            ("tokens_per_task", "output tokens a task"), ("input_tokens_per_task", "input tokens a task"),
            ("tool_calls_per_task", "tool calls a task"), ("wall_s_per_task", "wall s a task"),
            ("cost_per_task_usd", "cost a task (USD)"), ("total_cost_usd", "total cost (USD)"),
            ("finish_rate", "finished (called finish)"), ("infra_failures", "not scored (infrastructure)"),
            ("flagged", "flagged by the monitor"), ("monitor_action", "monitor action"), ("agent", "agent"),
            ("predictions_file", "predictions"), ("sandbox", "sandbox"), ("ci95_method", "interval"),
            ("wall_s", "wall s of this run"))
    rows = [(label, s[k]) for k, label in keys if s.get(k) is not None]
    if kind == "grade":
        rows += [(f"status {k}", v) for k, v in (s.get("statuses") or {}).items() if v]
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>" for k, v in rows) + "</table>"


def _strata_plot(strata: dict[str, dict[str, Any]]):
    return _rate_plot({k: v for k, v in strata.items() if k != "repo"})


def _rate_plot(groups: dict[str, dict[str, Any]]):
    """Horizontal bars of pass@1 with 95% intervals, one panel per group of values."""
    plt = _pyplot()
    groups = {g: rows for g, rows in groups.items() if rows}
    heights = [max(1.2, 0.35 * len(rows) + 0.8) for rows in groups.values()] or [1.2]
    fig, axes = plt.subplots(len(heights), 1, figsize=(8, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (group, rows) in zip(axes[:, 0], groups.items()):
        names = list(rows)
        p = [rows[v]["pass@1"] for v in names]
        lo = [max(0.0, p_ - rows[v]["ci95"][0]) for p_, v in zip(p, names)]  # rounding can put p a hair
        hi = [max(0.0, rows[v]["ci95"][1] - p_) for p_, v in zip(p, names)]  # outside its interval
        y = range(len(names))
        ax.barh(y, p, xerr=[lo, hi], color="#4c72b0", ecolor="#333", capsize=3)
        ax.set_yticks(list(y), [f"{v} (n={rows[v]['n']})" for v in names], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_title(group, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("pass@1 (bars: 95% interval)")
    fig.tight_layout()
    return fig


def _cost_plot(tasks: list[dict[str, Any]], kind: str):
    """Histograms of what a task cost: tokens, tool calls, wall time, USD (run); seconds and
    statuses (grade)."""
    plt = _pyplot()
    if kind == "run":
        scored = [t for t in tasks if t.get("n")]
        panels = [("output tokens", [t["mean_tokens"] for t in scored]),
                  ("input tokens", [t.get("mean_input_tokens", 0) for t in scored]),
                  ("tool calls", [t["mean_tool_calls"] for t in scored]),
                  ("wall s", [t["mean_wall_s"] for t in scored])]
        costs = [t["cost_usd"] for t in scored if t.get("cost_usd") is not None]
        if costs:
            panels.append(("USD", costs))
    else:
        statuses: dict[str, int] = {}
        for t in tasks:
            statuses[t["status"]] = statuses.get(t["status"], 0) + 1
        panels = [("grading s", [t["duration_s"] for t in tasks if not t.get("infra_failure")]),
                  ("status", statuses)]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) + 1, 2.6), squeeze=False)
    for ax, (label, values) in zip(axes[0], panels):
        if isinstance(values, dict):
            ax.bar(list(values), list(values.values()), color="#55a868")
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        else:
            ax.hist(values or [0], bins=min(20, max(5, len(values) // 3)), color="#4c72b0")
            ax.ticklabel_format(axis="x", useOffset=False, style="plain")
        ax.set_title(f"{label} a task" if not isinstance(values, dict) else label, fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("tasks", fontsize=8)
    fig.tight_layout()
    return fig


def _strata_table(strata: dict[str, dict[str, Any]], kind: str) -> str:
    cols = ["stratum", "value", "n", "pass@1", "95% CI"] + (["pass@k", "95% CI (pass@k)"] if kind == "run" else [])
    rows = []
    for stratum, values in strata.items():
        for value, r in values.items():
            cells = [stratum, value, r["n"], f"{r['pass@1']:.3f}", _ci(r["ci95"])]
            if kind == "run":
                cells += [f"{r['pass@k']:.3f}", _ci(r.get("ci95_pass@k"))]
            rows.append(cells)
    return _table(cols, rows)


def _tasks_table(tasks: list[dict[str, Any]], kind: str) -> str:
    if kind == "run":
        cols = ["task", "package", "outcomes", "pass@1", "out tokens", "in tokens", "tool calls", "wall s", "USD",
                "flags"]
        rows = [[t["task_id"], t.get("repo", ""), t.get("outcomes", ""), f"{t.get('pass_at_1', 0):.2f}",
                 f"{t.get('mean_tokens', 0):.0f}", f"{t.get('mean_input_tokens', 0):.0f}",
                 f"{t.get('mean_tool_calls', 0):.1f}", f"{t.get('mean_wall_s', 0):.1f}",
                 "" if t.get("cost_usd") is None else f"{t['cost_usd']:.4f}",
                 ", ".join(t.get("monitor_flags") or {})] for t in tasks]
    else:
        cols = ["task", "package", "status", "reward", "flags", "why not resolved", "s"]
        rows = [[t["instance_id"], t.get("repo", ""), t["status"], f"{t['reward']:.2f}",
                 ", ".join(t.get("monitor_flags") or ()), t.get("reason", ""), f"{t.get('duration_s', 0):.1f}"]
                for t in tasks]
    return _table(cols, rows)


def _counts_table(counts: dict[str, int], key: str, value: str) -> str:
    return _table([key, value], [[k, v] for k, v in counts.items()])


def _table(cols: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if isinstance(c, (int, float)) else ''}>{_e(_fmt(c))}</td>"
                                    for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(fig) -> str:
    """The figure as an <img> holding its PNG (base64): nothing outside the page."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return f"<img alt='plot' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _ci(ci) -> str:
    return f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else ""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return ", ".join(map(str, v)) if isinstance(v, list) else ", ".join(f"{k} {n}" for k, n in v.items())
    return str(v)


def _e(text: str) -> str:
    return html.escape(text, quote=True)
