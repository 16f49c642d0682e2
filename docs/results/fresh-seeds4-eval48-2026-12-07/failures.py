"""How the failed held-out episodes of seeds 25-29 end, at the warm start (step 0) and after RL (step 5),
and how many of all held-out episodes read a file.

Reads the transcripts `carl train` writes for every held-out episode (`<run>/transcripts/step0000N_eval_
*_{pass,fail}_*.txt`; not kept here, they are 10-15 kB each) and writes one line per episode to
failures.jsonl, then prints the counts per seed and step (failures.txt). Run from the repository root
on the runs of `learning.py --out runs/learning-fresh4 --seeds 25 26 27 28 29 --arms grpo+errcost+eval48`:
    .venv/bin/python docs/results/fresh-seeds4-eval48-2026-12-07/failures.py runs/learning-fresh4
Recount from the kept lines alone: failures.py --from-jsonl.
"""
import collections
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
KINDS = ("finished right after a failing test run", "fixed after a failing test, still failed",
         "ran out of turns", "finished without a failing test run", "other")


def classify(text: str) -> dict:
    """The episode's stop reason, its calls in order, and which of KINDS it is."""
    stop = re.search(r"stop: (\w+)", text).group(1)
    calls = re.findall(r"╭─ \[\d+\] (\w+) · ", text)  # each tool result's header (the call's tag may wrap)
    results = [r.strip() for r in re.findall(r"run_tests · [\d.]+s ─+\S*\s*│ Tests: ([^\n│]*)", text)]
    failed_runs = [r for r in results if "failed" in r or "error" in r]
    edits_after_fail = False
    if failed_runs:  # any edit or write after the first failing run_tests call
        first_fail = next(i for i, r in enumerate(results) if "failed" in r or "error" in r)
        run_positions = [i for i, c in enumerate(calls) if c == "run_tests"]
        if first_fail < len(run_positions):
            edits_after_fail = any(c in ("edit_file", "write_file") for c in calls[run_positions[first_fail] + 1:])
    if stop == "max_turns":
        kind = KINDS[2]
    elif stop == "finished" and failed_runs and not edits_after_fail:
        kind = KINDS[0]
    elif stop == "finished" and failed_runs:
        kind = KINDS[1]
    elif stop == "finished":
        kind = KINDS[3]
    else:
        kind = KINDS[4]
    return {"stop": stop, "calls": calls, "test_runs": results, "kind": kind}


def collect(out: Path) -> list[dict]:
    rows = []
    for run in sorted(out.glob("seed*_grpo+errcost+eval48")):
        seed = int(run.name[4:].split("_")[0])
        for path in sorted((run / "transcripts").glob("step0000[05]_eval_*.txt")):
            step, outcome = int(path.name[4:9]), path.name.split("_")[3]
            task = path.name.split(f"_{outcome}_")[1][:-4]
            rows.append({"seed": seed, "step": step, "task": task, "outcome": outcome, **classify(path.read_text())})
    return rows


def main() -> None:
    if sys.argv[1:] == ["--from-jsonl"]:
        every = [json.loads(line) for line in (HERE / "failures.jsonl").read_text().splitlines()]
    else:
        every = collect(Path(sys.argv[1]))
        (HERE / "failures.jsonl").write_text("".join(json.dumps(r) + "\n" for r in every))
    rows = [r for r in every if r["outcome"] == "fail"]
    counts = collections.Counter((r["seed"], r["step"], r["kind"]) for r in rows)
    print("failed held-out episodes (of 2 samples x the seed's tasks) by how they ended")
    print("| seed | step | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for seed in sorted({r["seed"] for r in rows}):
        for step in (0, 5):
            print(f"| {seed} | {step} | " + " | ".join(str(counts[(seed, step, k)]) for k in KINDS) + " |")
    for step in (0, 5):
        total = sum(counts[(s, step, k)] for s in {r["seed"] for r in rows} for k in KINDS)
        first = sum(counts[(s, step, KINDS[0])] for s in {r["seed"] for r in rows})
        unread = sum(1 for r in rows if r["step"] == step and "read_file" not in r["calls"])
        print(f"step {step}: {first} of {total} failed episodes finished right after a failing test run; "
              f"{unread} of {total} never called read_file")
    print("\nheld-out episodes that called read_file, of all (passed and failed): step 0 -> step 5")
    for seed in sorted({r["seed"] for r in every}):
        read = [sum("read_file" in r["calls"] for r in every if r["seed"] == seed and r["step"] == s) for s in (0, 5)]
        n = [sum(1 for r in every if r["seed"] == seed and r["step"] == s) for s in (0, 5)]
        print(f"seed {seed}: {read[0]}/{n[0]} -> {read[1]}/{n[1]}")


main()
