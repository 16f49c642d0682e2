"""After the fact (not planned in compare.py): what held-out episodes did after a failing first test
run, at the warm start and after RL, per seed. Seeds 36 and 37 gained little with weak warm starts,
and RL moved this habit in opposite directions there (seed 36 to editing again, seed 37 to finishing).

Collect once from the transcripts (not kept, 10-20 kB each) into episodes.jsonl, then print:
    .venv/bin/python docs/results/fresh-seeds6-eval120-2026-12-08/habits.py --collect runs/learning-fresh6
    .venv/bin/python docs/results/fresh-seeds6-eval120-2026-12-08/habits.py
"""
import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
ARM = "grpo+errcost+eval120"


def episode(text: str) -> dict:
    """Calls in order (from each tool result's header), each test run's result line, and the stop."""
    calls = re.findall(r"╭─ \[\d+\] (\w+) · ", text)
    runs = [r.strip() for r in re.findall(r"run_tests · [\d.]+s ─+\S*\s*│ Tests: ([^\n│]*)", text)]
    return {"stop": re.search(r"stop: (\w+)", text).group(1), "calls": calls, "test_runs": runs}


def collect(out: Path) -> None:
    rows = []
    for run in sorted(out.glob(f"seed*_{ARM}")):
        if not (run / "report.json").exists():  # still running
            continue
        seed = int(run.name[4:].split("_")[0])
        paths = sorted((run / "transcripts").glob("step*_eval_*.txt"))
        last = max(int(p.name[4:9]) for p in paths)
        for path in paths:
            step, outcome = int(path.name[4:9]), path.name.split("_")[3]
            if step in (0, last):
                rows.append({"seed": seed, "step": step, "task": path.name.split(f"_{outcome}_")[1][:-4],
                             "outcome": outcome, **episode(path.read_text())})
    (HERE / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def after_first_failing_run(r: dict) -> str | None:
    """None unless the first test run failed; else 'edit again', 'finish' or 'other' (the next step)."""
    if not r["test_runs"] or not re.search(r"failed|error", r["test_runs"][0]):
        return None
    rest = r["calls"][r["calls"].index("run_tests") + 1:]
    if any(c in ("edit_file", "write_file") for c in rest):
        return "edit again"
    return "finish" if rest[:1] == ["finish"] else "other"


def main() -> None:
    if sys.argv[1:2] == ["--collect"]:
        collect(Path(sys.argv[2]))
    rows = [json.loads(line) for line in (HERE / "episodes.jsonl").read_text().splitlines()]
    print("| seed | eval | episodes | passed | first run failed | then edited again | then finished | other | "
          "edited again and passed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in sorted({r["seed"] for r in rows}):
        steps = sorted({r["step"] for r in rows if r["seed"] == seed})
        for step, name in zip(steps, ("warm start", "after RL")):
            mine = [r for r in rows if r["seed"] == seed and r["step"] == step]
            kind = Counter(after_first_failing_run(r) for r in mine)
            again_passed = sum(after_first_failing_run(r) == "edit again" and r["outcome"] == "pass" for r in mine)
            print(f"| {seed} | {name} | {len(mine)} | {sum(r['outcome'] == 'pass' for r in mine)} | "
                  f"{len(mine) - kind[None]} | {kind['edit again']} | {kind['finish']} | {kind['other']} | {again_passed} |")


main()
