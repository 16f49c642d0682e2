"""Five fresh seeds (30-34) of the default after the expert's words changed (4732799: the same
"Now the tests." before every test run, the planted wrong edit's included), on 48 held-out repos
(arm `grpo+errcost+eval48`).

Planned before any of them ran (this file was committed while seed 30 was running): the seeds, the
arm, and what is read off.
1. Issue 30's target on seeds 30-34: at least 4 of 5 beyond 2 standard errors over tasks, and the
   95% t-interval of the mean gain above 0. Also on the first 24 of the 48 repos (the demo's eval).
2. The mechanism the change aims at: of the held-out episodes whose first test run failed, how many
   edited again before stopping, at the warm start (step 0) and after RL (step 5); next to seeds
   25-29 (the old words, `../fresh-seeds4-eval48-2026-12-07/failures.jsonl`). Different seeds, so
   this is a between-sets comparison, read as a direction, not a test.
3. For context only, never pooled with 30-34 (a different default): seeds 10-29 of the old words.

Run from the repository root. Collect the episodes from the transcripts once (they are not kept,
10-15 kB each), then print:
    .venv/bin/python docs/results/fresh-seeds5-expert-words-2026-12-07/compare.py --collect runs/learning-fresh5
    .venv/bin/python docs/results/fresh-seeds5-expert-words-2026-12-07/compare.py
"""
import json
import re
import sys
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread
from carl.micro.world import split_seeds

HERE = Path(__file__).parent
SEEDS = (30, 31, 32, 33, 34)
ARM = "grpo+errcost+eval48"
OLD_WORDS = HERE.parent / "fresh-seeds4-eval48-2026-12-07"  # seeds 25-29, their failures.jsonl
EARLIER_48 = ((HERE.parent / "fresh-seeds3-eval48-2026-12-07", (20, 21, 22, 23, 24)), (OLD_WORDS, (25, 26, 27, 28, 29)))
EARLIER_24 = ((HERE.parent / "fresh-seeds-2026-12-07", (10, 11, 12, 13, 14)),
              (HERE.parent / "fresh-seeds2-2026-12-07", (15, 16, 17, 18, 19)))


def evals(run: Path) -> tuple[dict, dict]:
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def first_repos(report: dict, seed: int, repos: int) -> dict:
    """`report` cut to the tasks of the split's first `repos` eval repos (task ids start `repo<N>__`)."""
    keep = {f"repo{s}__" for s in split_seeds("eval", seed, repos)}
    return {**report, "tasks": [t for t in report["tasks"] if t["task_id"].split("__")[0] + "__" in keep]}


def gain(warm: dict, rl: dict) -> tuple[float, float]:
    d = paired_difference(warm, rl)
    return d.diff, d.diff / over_tasks(d).se_paired


def spread_line(name: str, rows: list[tuple[float, float]]) -> str:
    s = seed_spread([g for g, _ in rows])
    return (f"{name}: RL - warm mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to "
            f"{s.high:+.3f} (n = {s.n}); {sum(z > 2 for _, z in rows)} of {s.n} beyond 2 s.e. over tasks")


def episode(text: str) -> dict:
    """Calls in order (from each tool result's header), each test run's result line, and the stop."""
    calls = re.findall(r"╭─ \[\d+\] (\w+) · ", text)
    runs = [r.strip() for r in re.findall(r"run_tests · [\d.]+s ─+\S*\s*│ Tests: ([^\n│]*)", text)]
    return {"stop": re.search(r"stop: (\w+)", text).group(1), "calls": calls, "test_runs": runs}


def collect(out: Path) -> None:
    rows = []
    for seed in SEEDS:
        for path in sorted((out / f"seed{seed}_{ARM}" / "transcripts").glob("step0000[05]_eval_*.txt")):
            step, outcome = int(path.name[4:9]), path.name.split("_")[3]
            rows.append({"seed": seed, "step": step, "task": path.name.split(f"_{outcome}_")[1][:-4],
                         "outcome": outcome, **episode(path.read_text())})
    (HERE / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def edited_after_first_failing_run(r: dict) -> bool | None:
    """None when the first test run did not fail (or there was none); else whether an edit followed."""
    if not r["test_runs"] or not re.search(r"failed|error", r["test_runs"][0]):
        return None
    first_run = r["calls"].index("run_tests") if "run_tests" in r["calls"] else len(r["calls"])
    return any(c in ("edit_file", "write_file") for c in r["calls"][first_run + 1:])


def recoveries(rows: list[dict], name: str) -> None:
    for step in (0, 5):
        seen = [edited_after_first_failing_run(r) for r in rows if r["step"] == step]
        failing = [x for x in seen if x is not None]
        fixed = sum(r["outcome"] == "pass" for r in rows if r["step"] == step and edited_after_first_failing_run(r))
        print(f"{name}, step {step}: first test run failed in {len(failing)} of {len(seen)} episodes; "
              f"{sum(failing)} edited again ({sum(failing) / max(len(failing), 1):.0%}), {fixed} of them passed")


def main() -> None:
    if sys.argv[1:2] == ["--collect"]:
        collect(Path(sys.argv[2]))
    print("| seed | eval | held-out tasks | warm start | after RL | RL - warm | z | finish: warm -> RL |")
    print("|---|---|---|---|---|---|---|---|")
    rows: dict[str, list[tuple[float, float]]] = {"48 repos": [], "first 24 repos": []}
    for seed in SEEDS:
        warm, rl = evals(HERE / f"seed{seed}_{ARM}")
        for name, (a, b) in (("48 repos", (warm, rl)),
                             ("first 24 repos", (first_repos(warm, seed, 24), first_repos(rl, seed, 24)))):
            d = paired_difference(a, b)
            rows[name].append(gain(a, b))
            print(f"| {seed} | {name} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} | "
                  f"{rows[name][-1][1]:.1f} | {a['summary']['finish_rate']:.2f} -> {b['summary']['finish_rate']:.2f} |")
    print()
    for name, r in rows.items():
        print(spread_line(f"seeds 30-34 (new words), {name}", r))
    print("\nfor context, the old words (not pooled with the above):")
    old48 = [gain(*evals(f / f"seed{s}_{ARM}")) for f, seeds in EARLIER_48 for s in seeds]
    print(spread_line("seeds 20-29, 48 repos", old48))
    old24 = [gain(*(first_repos(x, s, 24) for x in evals(f / f"seed{s}_{ARM}"))) for f, seeds in EARLIER_48 for s in seeds]
    old24 += [gain(*evals(f / f"seed{s}_grpo+errcost")) for f, seeds in EARLIER_24 for s in seeds]
    print(spread_line("seeds 10-29, first 24 repos", old24))
    print("\nheld-out episodes whose first test run failed: did the model edit again?")
    new = [json.loads(line) for line in (HERE / "episodes.jsonl").read_text().splitlines()]
    old = [json.loads(line) for line in (OLD_WORDS / "failures.jsonl").read_text().splitlines()]
    recoveries(new, "seeds 30-34, new words")
    recoveries(old, "seeds 25-29, old words")


main()
