"""Where a run is, live: its phase, the units of work done of the phase's total, the rate and an ETA.

    world 18/42 repos | expert 20/32 episodes | warm start epoch 2/3 7/12 batches
    eval warm start 30/36 episodes | RL step 3/8 17/32 rollouts (rollouts of later steps included)

On a terminal it is one rich progress line under the run's other output. Into a log (stdout not a
terminal) it prints a line when a phase starts, at each quarter of it and when it ends, so a run
under `nohup` or CI still says where it is. Work may be reported from any thread.

Each phase that ends is kept (`spent`): its group (e.g. "warm start" for every epoch, "RL" for
every step), wall seconds and units; `time_record` gives them with the total, `time_table` shows it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


@dataclass(frozen=True)
class PhaseTime:
    """Wall time of one group of phases: consecutive phases of one group add up."""

    group: str
    wall_s: float
    done: int
    unit: str


class RunProgress:
    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self._lock = threading.Lock()
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TextColumn("ETA"),
                             TimeRemainingColumn(), console=console, transient=False) if self.live else None
        self._task = None
        self._name, self._total, self._done, self._unit, self._t0, self._quarter = "", 0, 0, "", 0.0, 0
        self._group = ""
        self.started = time.monotonic()
        self.spent: list[PhaseTime] = []

    def __enter__(self) -> RunProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.end()
        if self._bar is not None:
            self._bar.stop()

    def phase(self, name: str, total: int, unit: str, group: str = "") -> None:
        """A new phase of `total` units (the previous one ends); its time counts toward `group`
        (default: `name`), which consecutive phases of one group share."""
        self.end()
        with self._lock:
            self._name, self._total, self._done, self._unit = name, total, 0, unit
            self._group = group or name
            self._t0, self._quarter = time.monotonic(), 0
            if self._bar is not None:
                self._task = self._bar.add_task(name, total=total, unit=unit)
            else:
                self._print(f"{name}: 0/{total} {unit}")

    def describe(self, name: str) -> None:
        """Rename the current phase (e.g. the RL step it is at)."""
        with self._lock:
            self._name = name
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=name)

    def grow(self, extra: int) -> None:
        """The phase has `extra` more units than announced (e.g. dynamic sampling's extra batches)."""
        with self._lock:
            self._total += extra
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, total=self._total)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._done += n
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, advance=n)
            elif self._total and self._done * 4 // self._total > self._quarter and self._done < self._total:
                self._quarter = self._done * 4 // self._total
                self._print(self._line())

    def end(self) -> None:
        with self._lock:
            if self._name:
                self._keep(PhaseTime(self._group, time.monotonic() - self._t0, self._done, self._unit))
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, completed=max(self._done, 0), total=max(self._total, self._done))
                self._bar.stop_task(self._task)
            elif self._bar is None and self._name:
                self._print(f"{self._line()} (done)")
            self._task, self._name = None, ""

    def _keep(self, t: PhaseTime) -> None:
        last = self.spent[-1] if self.spent else None
        if last is not None and last.group == t.group and last.unit == t.unit:
            self.spent[-1] = PhaseTime(t.group, last.wall_s + t.wall_s, last.done + t.done, t.unit)
        else:
            self.spent.append(t)

    def time_record(self) -> dict:
        """`spent` and the total as JSON-ready numbers (what <run_dir>/time.json keeps)."""
        total = time.monotonic() - self.started
        return {"total_s": round(total, 1),
                "phases": [{"group": t.group, "wall_s": round(t.wall_s, 1), "done": t.done, "unit": t.unit}
                           for t in self.spent]}

    def _print(self, line: str) -> None:
        self.console.print(f"[progress] {line}", markup=False, highlight=False, soft_wrap=True)

    def _line(self) -> str:
        elapsed = time.monotonic() - self._t0
        rate = self._done / elapsed if elapsed > 0 else 0.0
        left = (self._total - self._done) / rate if rate > 0 else float("nan")
        eta = f", ETA {clock(left)}" if left == left else ""
        return f"{self._name}: {self._done}/{self._total} {self._unit} in {clock(elapsed)}{eta}"

    @property
    def done(self) -> int:
        """Units done in the current phase."""
        return self._done


def time_table(record: dict, title: str = "where this process's time went"):
    """A rich Table of a `RunProgress.time_record`, with the time between phases (loading the model,
    checkpoints, weight syncs) as "between phases" and the share of the total each took."""
    from rich.table import Table

    from carl.eval.report import add_columns

    total = record["total_s"]
    table = Table(title=title)
    add_columns(table, ("phase", "work", "wall", "share"), "phase")
    rows = [(p["group"], f"{p['done']} {p['unit']}", p["wall_s"]) for p in record["phases"]]
    rows.append(("between phases", "", max(0.0, total - sum(p["wall_s"] for p in record["phases"]))))
    for i, (name, work, wall) in enumerate(rows):
        table.add_row(name, work, clock(wall), f"{wall / total:.0%}" if total > 0 else "",
                      end_section=i == len(rows) - 1)
    table.add_row("total", "", clock(total), "")
    return table


def clock(seconds: float) -> str:
    """Seconds as m:ss, or h:mm:ss from an hour on."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"
