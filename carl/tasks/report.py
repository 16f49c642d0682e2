"""Tables for `carl tasks build` (per repo outcome) and `carl tasks stats`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.table import Table
from rich.text import Text

from carl.io import read_jsonl
from carl.tasks.record import TaskRecord
from carl.tasks.store import store_dir

SIZE_BINS = ((1, 5), (6, 20), (21, 80), (81, 10**9))
"""Bins of size_lines for the curriculum view (easy ... hard)."""


def summary_table(results) -> Table:
    t = Table(title="carl tasks build")
    for col in ("repo", "status", "tasks", "tried", "drops", "tests kept", "wall s", "note"):
        t.add_column(col, overflow="fold")  # wrapped, never cut to "repo…" in a log or a narrow terminal
    for r in results:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(r.drops.items()))
        t.add_row(
            r.name or r.spec,
            r.status,
            str(r.n_tasks),
            str(r.n_attempts),
            drops or "-",
            str(r.n_tests),
            f"{r.wall_s:.0f}",
            Text(repo_note(r)),  # plain text: "[...]" in an error or in code is not markup
        )
    return t


def repo_note(r) -> str:
    """What a repo's row and line add to the counts: its error, its warning, and per drop reason
    the first drop's detail (where a leak was found)."""
    details = [f"{reason} e.g. {detail}" for reason, detail in sorted(r.drop_details.items())]
    return "; ".join(x for x in (r.error, r.warning, *details) if x)[:400]


def stats_tables(tasks: list[TaskRecord], tasks_path: str | Path) -> list[Table]:
    tables = []
    for title, key in (
        ("by repo", lambda t: t.repo),
        ("by kind", lambda t: t.deletion_kind),
        ("by mode", lambda t: t.deletion_mode),
        ("by size (lines)", _size_bin),
        ("by files changed", lambda t: str(t.size_files)),
    ):
        counts = Counter(key(t) for t in tasks)
        table = Table(title=f"{len(tasks)} tasks {title}")
        table.add_column(title.split()[-1].strip("()"))
        table.add_column("tasks", justify="right")
        for k, v in sorted(counts.items(), key=lambda kv: natural_key(kv[0])):  # "6-20" before "21-80"
            table.add_row(k, str(v))
        tables.append(table)
    drops_path = store_dir(tasks_path) / "drops.jsonl"
    if drops_path.is_file():
        rows = read_jsonl(drops_path)
        drops = Counter((d["repo"], d["reason"]) for d in rows)
        example: dict[tuple[str, str], str] = {}
        for d in rows:
            if d.get("detail"):
                example.setdefault((d["repo"], d["reason"]), f"{d.get('candidate', '?')}: {d['detail']}")
        table = Table(title="drop reasons")
        for col in ("repo", "reason", "count", "e.g. (candidate: where)"):
            table.add_column(col, overflow="fold")
        for (repo, reason), n in sorted(drops.items()):
            table.add_row(repo, reason, str(n), Text(example.get((repo, reason), "")))
        tables.append(table)
    return tables


def natural_key(text: str) -> list:
    """Sort key that orders the numbers inside `text` as numbers ("2" < "10", "6-20" < "21-80")."""
    import re

    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _size_bin(t: TaskRecord) -> str:
    for lo, hi in SIZE_BINS:
        if lo <= t.size_lines <= hi:
            return f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}"
    return "0"
