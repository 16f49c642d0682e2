"""Does RL keep the finish habit? Held-out pass@1 and how episodes end, warm start vs after RL, for
runs grouped into arms (e.g. branches of one warm start with different shaping, several seeds each).

    .venv/bin/python benchmarks/finish.py score=runs/score score=runs/score-s1 \
        mask=runs/mask mask=runs/mask-s1 --out docs/results/finish-2026-12-04

Per run (its first and last eval report, `eval/step*.json`, and the eval transcripts beside them):
pass@1 of both and RL - warm start with its paired standard error over tasks (`carl.eval.paired`);
finish rate (episodes that called finish); done|pass (of the passing episodes, those that called
finish: an agent that solved the task and ran on to the turn limit never said it was done); context
resets per episode, summaries cut at the token limit, and the turn of the first reset. Per arm over
its runs: mean, sample standard deviation and 95% t-interval (`carl.eval.seeds`) of RL - warm start,
of the finish rate after RL and of done|pass after RL.

Stop reasons and resets per episode come from the eval report's per-sample `finished` record where
it has one and from the transcripts otherwise (their `stop:` line and turn headers), so runs made
before the record existed are read too. Written to <out>/finish.json (every run's numbers and the
arms' statistics) and <out>/episodes.jsonl (one row per held-out episode).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread
from carl.io import atomic_write_json, atomic_write_jsonl

TRANSCRIPT = re.compile(r"step(\d+)_eval_(\d+)_(pass|fail|infra)_(.+)\.txt$")


def episodes(run: Path, step: int) -> list[dict]:
    """One row per eval episode of `step`, in sample order, read from the transcripts."""
    rows = []
    for p in sorted(run.glob(f"transcripts/step{step:05d}_eval_*.txt")):
        m = TRANSCRIPT.search(p.name)
        text = p.read_text()
        stop = re.search(r"^stop: (\w+)", text, re.M)
        heads = re.findall(r"─ turn (\d+) · (summary|assistant)([^\n]*)", text)
        summaries = [(int(n), rest) for n, kind, rest in heads if kind == "summary"]
        rows.append({"run": str(run), "step": step, "index": int(m.group(2)), "task": m.group(4),
                     "verdict": m.group(3), "stop": stop.group(1) if stop else "unknown",
                     "resets": len(summaries), "summaries_cut": sum("cut at the token limit" in r for _, r in summaries),
                     "first_reset_turn": summaries[0][0] if summaries else None})
    return rows


def describe(rows: list[dict]) -> dict:
    scored = [r for r in rows if r["verdict"] != "infra"]
    passed = [r for r in scored if r["verdict"] == "pass"]
    n = max(len(scored), 1)
    return {"episodes": len(scored), "passed": len(passed),
            "finish_rate": sum(r["stop"] == "finished" for r in scored) / n,
            "passes_finished": sum(r["stop"] == "finished" for r in passed) / len(passed) if passed else None,
            "resets_per_episode": sum(r["resets"] for r in scored) / n,
            "episodes_with_a_reset": sum(r["resets"] > 0 for r in scored),
            "summaries_cut": sum(r["summaries_cut"] for r in scored),
            "stops": dict(sorted(Counter(r["stop"] for r in scored).items()))}


def step_of(report_path: Path) -> int:
    return int(re.search(r"(\d+)", report_path.stem).group(1))


def digests(report: dict) -> tuple[str, ...]:
    return tuple(d for t in report["tasks"] for d in t.get("digests", []))


def run_summary(arm: str, run: Path, made_by: dict[tuple, list[dict]]) -> tuple[dict, list[dict]]:
    """`made_by`: a warm-start eval's per-sample digests -> its episodes, read from the run whose
    transcripts hold it (a branch copies its source's report but not the transcripts)."""
    reports = sorted(run.glob("eval/step*.json"))
    if len(reports) < 2:
        raise SystemExit(f"{run}: expected a warm-start and an after-RL eval report under eval/, found "
                         f"{[p.name for p in reports]}")
    first, last = reports[0], reports[-1]
    warm, rl = (json.loads(p.read_text()) for p in (first, last))
    steps = [step_of(p) for p in (first, last)]
    warm_rows = made_by.get(digests(warm)) or episodes(run, steps[0])
    by_step = {steps[0]: warm_rows, steps[1]: episodes(run, steps[1])}
    for s, report in zip(steps, (warm, rl)):  # the report's own per-sample record checks the transcripts
        outcomes = "".join(x["outcomes"] for x in report["tasks"])
        read = "".join({"pass": "1", "fail": "0", "infra": "x"}[r["verdict"]] for r in by_step[s])
        if read != outcomes:
            raise SystemExit(f"{run}: the step-{s} eval transcripts ({len(read)}) do not match its report's "
                             f"per-sample outcomes ({len(outcomes)}); pass every run that made a warm-start "
                             f"eval a branch copied")
    rows = [dict(r, arm=arm, run=str(run)) for s in steps for r in by_step[s]]
    d = paired_difference(warm, rl)
    t = over_tasks(d)
    return {"arm": arm, "run": str(run), "steps": steps,
            "pass@1": [warm["summary"]["pass@1"], rl["summary"]["pass@1"]],
            "rl_minus_warm": d.diff, "se_over_tasks": t.se_paired, "tasks_better": d.tasks_better,
            "tasks_worse": d.tasks_worse,
            "warm": describe(by_step[steps[0]]), "rl": describe(by_step[steps[1]])}, rows


def spread(values: list[float]) -> dict:
    return asdict(seed_spread(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="ARM=RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    specs = []
    for spec in args.runs:
        arm, sep, path = spec.partition("=")
        if not sep or not Path(path).is_dir():
            raise SystemExit(f"{spec!r}: expected ARM=RUN_DIR with an existing run directory")
        specs.append((arm, Path(path)))
    made_by = {}
    for _, run in specs:
        first = min(run.glob("eval/step*.json"), default=None)
        if first and (rows := episodes(run, step_of(first))):
            made_by[digests(json.loads(first.read_text()))] = rows
    results, all_rows = [], []
    for arm, run in specs:
        summary, rows = run_summary(arm, run, made_by)
        results.append(summary)
        all_rows += rows
    arms = {}
    for arm in dict.fromkeys(r["arm"] for r in results):
        mine = [r for r in results if r["arm"] == arm]
        arms[arm] = {"runs": len(mine),
                     "rl_minus_warm": spread([r["rl_minus_warm"] for r in mine]),
                     "finish_rate_after_rl": spread([r["rl"]["finish_rate"] for r in mine]),
                     "passes_finished_after_rl": spread([r["rl"]["passes_finished"] for r in mine
                                                         if r["rl"]["passes_finished"] is not None]),
                     "resets_per_episode_after_rl": spread([r["rl"]["resets_per_episode"] for r in mine])}
    pf = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    cols = ("pass@1", "RL-warm ± se", "done", "done|pass", "resets", "cut")
    print(f"{'arm':<10} {'run':<20} " + " ".join(f"{c:>{width}}" for c, width in zip(cols, (11, 14, 9, 9, 9, 5))))
    for r in results:
        w, a = r["warm"], r["rl"]
        cells = (f"{r['pass@1'][0]:.3f}>{r['pass@1'][1]:.3f}", f"{r['rl_minus_warm']:+.3f} ± {r['se_over_tasks']:.3f}",
                 f"{w['finish_rate']:.2f}>{a['finish_rate']:.2f}", f"{pf(w['passes_finished'])}>{pf(a['passes_finished'])}",
                 f"{w['resets_per_episode']:.2f}>{a['resets_per_episode']:.2f}", f"{w['summaries_cut']}>{a['summaries_cut']}")
        print(f"{r['arm']:<10} {Path(r['run']).name:<20} " + " ".join(f"{c:>{width}}" for c, width in zip(cells, (11, 14, 9, 9, 9, 5))))
    for arm, s in arms.items():
        g = s["rl_minus_warm"]
        interval = "one run: no interval" if g["sd"] is None else f"sd {g['sd']:.3f}, 95% {g['low']:+.3f} to {g['high']:+.3f}"
        print(f"{arm}: {s['runs']} runs; RL - warm start {g['mean']:+.3f} ({interval}); finish rate after RL "
              f"{s['finish_rate_after_rl']['mean']:.2f}; resets per episode after RL "
              f"{s['resets_per_episode_after_rl']['mean']:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "finish.json", {"runs": results, "arms": arms})
    atomic_write_jsonl(args.out / "episodes.jsonl", all_rows)
    print(f"wrote {args.out / 'finish.json'} and {args.out / 'episodes.jsonl'}")


if __name__ == "__main__":
    main()
