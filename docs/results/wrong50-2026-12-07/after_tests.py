"""What a held-out episode says before its first test run, whether that run failed, and what its next
turn does (edit, finish or other): the default (`grpo+errcost+eval48`, seeds 26 and 27 of
fresh-seeds4) against the expert's wrong-constant recovery in half its episodes
(`grpo+errcost+wrong50`), at the warm start (step 0) and after RL (step 5).

The expert says "Let me check it." before the test run of its planted wrong edit and "Now the tests."
before every other, so in the warm-start data "Now the tests." is always followed by a passing run
and finish. Reads the transcripts `carl train` writes (not kept here); writes after_tests.jsonl (one
line per held-out episode) and prints the counts (after_tests.txt). Run from the repository root:
    .venv/bin/python docs/results/wrong50-2026-12-07/after_tests.py runs/learning-fresh4 runs/learning-wrong50
or, from the kept lines alone: after_tests.py --from-jsonl
"""
import collections
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
ARMS = ("grpo+errcost+eval48", "grpo+errcost+wrong50")
SEEDS = (26, 27)


def first_test_run(text: str) -> dict | None:
    """The message before the episode's first run_tests call, that run's result, the next turn's action."""
    turns = [re.sub(r"[│\s]+", " ", t).strip() for t in re.findall(r"turn \d+ · assistant[^\n]*\n(.*?)╰", text, re.S)]
    at = next((i for i, t in enumerate(turns) if 'name="run_tests"' in t), None)
    result = re.search(r"run_tests · [\d.]+s ─+\S*\s*│ Tests: ([^\n│]*)", text)
    if at is None or result is None:
        return None
    following = turns[at + 1] if at + 1 < len(turns) else ""
    action = ("edit" if re.search(r'name="(edit_file|write_file)"', following)
              else "finish" if 'name="finish"' in following else "other")
    return {"says": turns[at].split("<tool")[0].strip(), "run": "fail" if re.search(r"failed|error", result.group(1)) else "pass",
            "next": action}


def collect(dirs: list[Path]) -> list[dict]:
    rows = []
    for out in dirs:
        for arm in ARMS:
            for seed in SEEDS:
                run = out / f"seed{seed}_{arm}"
                for path in sorted((run / "transcripts").glob("step0000[05]_eval_*.txt")):
                    found = first_test_run(path.read_text())
                    if found is not None:
                        rows.append({"arm": arm, "seed": seed, "step": int(path.name[4:9]), "episode": path.name, **found})
    return rows


def main() -> None:
    if sys.argv[1:] == ["--from-jsonl"]:
        rows = [json.loads(line) for line in (HERE / "after_tests.jsonl").read_text().splitlines()]
    else:
        rows = collect([Path(a) for a in sys.argv[1:]])
        (HERE / "after_tests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("held-out episodes by what they say before their first test run, its result, and the next turn")
    for arm in ARMS:
        for seed in SEEDS:
            for step in (0, 5):
                part = [r for r in rows if (r["arm"], r["seed"], r["step"]) == (arm, seed, step)]
                counts = collections.Counter((r["says"][:20], r["run"], r["next"]) for r in part)
                print(f"{arm}, seed {seed}, step {step}: {len(part)} episodes")
                for (says, run, action), n in counts.most_common():
                    print(f"  {n:3d}  says {says!r:24} run {run}  next {action}")


main()
