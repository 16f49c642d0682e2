"""Seed 29 twice: the expert's old words (session 37's run, `../fresh-seeds4-eval48-2026-12-07/`)
and the new ones (4732799: "Now the tests." before every test run), everything else the same,
scored on the same 48 held-out repos with the same random numbers. Chosen after seeing seeds 30-34
(seed 29 had the strongest warm start and the worst RL of seeds 25-29). episodes.jsonl holds the
new run's held-out episodes (calls, test results; written from its transcripts, not kept) as
`../fresh-seeds4-eval48-2026-12-07/failures.jsonl` holds the old run's. Run from the repository root:
    .venv/bin/python docs/results/words-seed29-2026-12-07/compare.py
"""
import json
import re
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference

HERE = Path(__file__).parent
OLD = HERE.parent / "fresh-seeds4-eval48-2026-12-07"
RUN = "seed29_grpo+errcost+eval48"


def evals(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "eval").glob("step*.json"))]


for step, old, new in zip((0, 5), evals(OLD / RUN), evals(HERE / RUN)):
    d = paired_difference(old, new)
    se = over_tasks(d).se_paired
    print(f"step {step}: old words {d.pass_a:.3f}, new words {d.pass_b:.3f}, new - old {d.diff:+.3f} ± {se:.3f} "
          f"over {d.tasks} tasks; tasks better / worse {d.tasks_better} / {d.tasks_worse}")


def edited_again(rows: list[dict], step: int) -> str:
    """Of the step's episodes whose first test run failed, how many edited after it."""
    failing = [r for r in rows if r["step"] == step and r["test_runs"] and re.search(r"failed|error", r["test_runs"][0])]
    again = [r for r in failing if any(c in ("edit_file", "write_file")
                                       for c in r["calls"][r["calls"].index("run_tests") + 1:])]
    return f"{len(again)} of {len(failing)}"


old_rows = [json.loads(line) for line in (OLD / "failures.jsonl").read_text().splitlines()]
old_rows = [r for r in old_rows if r["seed"] == 29]
new_rows = [json.loads(line) for line in (HERE / "episodes.jsonl").read_text().splitlines()]
for step in (0, 5):
    print(f"step {step}: episodes whose first test run failed and that edited again: old words "
          f"{edited_again(old_rows, step)}, new words {edited_again(new_rows, step)}")
