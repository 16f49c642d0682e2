"""The self-summarization ablation of configs/long-horizon.toml over seeds: summaries trained with the
episode's reward (`summaries`), summaries with no gradient (`summaries-no-grad`), a truncating context
(`truncate`). Seed 0 from ../ablation-seed0-2026-12-02/ (kept before learning.py's --keep layout),
the later seeds from this folder (learning.py --keep). Run from the repository root:
    .venv/bin/python docs/results/summaries/ablation-2026-12-05/ablation.py

Per seed and arm: held-out pass@1 after RL, RL - warm start with its standard error over tasks (and
the samples' luck alone), context resets a task and finish rate after RL. Per seed, arm against arm
after RL (same tasks, same random numbers). Over seeds: mean, sample sd and 95% t-interval
(carl.eval.seeds), each over the seeds that finished that arm or pair. Seed 0's truncate arm
shares the summaries arm's warm-start eval (a branch did not re-evaluate then), so its RL - warm
start mixes RL with the change of context strategy; the after-RL comparisons are clean in every
seed.
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SEED0 = HERE.parent / "ablation-seed0-2026-12-02"
ARMS = ("summaries", "summaries-no-grad", "truncate")
PAIRS = (("summaries-no-grad", "summaries"), ("summaries", "truncate"), ("summaries-no-grad", "truncate"))


def evals(seed: int, arm: str) -> tuple[dict, dict] | None:
    """(warm-start eval, after-RL eval) of one run, or None if it has not finished."""
    if seed == 0:
        return (json.loads((SEED0 / "warm_start_step000000.json").read_text()),
                json.loads((SEED0 / arm / "step000005.json").read_text()))
    run = HERE / f"seed{seed}_{arm}"
    if not (run / "report.json").exists():
        return None
    reports = sorted((run / "eval").glob("step*.json"))
    return json.loads(reports[0].read_text()), json.loads(reports[-1].read_text())


def finished() -> dict[int, dict[str, tuple[dict, dict]]]:
    """seed -> {arm: (warm-start eval, after-RL eval)} of every finished run (a seed may lack arms)."""
    later = sorted({int(p.name.split("_")[0][4:]) for p in HERE.glob("seed*_*") if p.is_dir()})
    runs = {seed: {arm: evals(seed, arm) for arm in ARMS} for seed in [0] + later}
    return {seed: {arm: e for arm, e in arms.items() if e} for seed, arms in runs.items()}


def main() -> None:
    runs = finished()
    print("| seed | arm | warm start | after RL | RL - warm ± s.e. over tasks (samples' luck) | resets / task | finish |")
    print("|---|---|---|---|---|---|---|")
    gains: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for seed, arms in runs.items():
        for arm, (warm, rl) in arms.items():
            d = paired_difference(warm, rl)
            gains[arm].append(d.diff)
            s = rl["summary"]
            print(f"| {seed} | {arm} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {over_tasks(d).se_paired:.3f} "
                  f"({d.se_paired:.3f}) | {s.get('context_resets_per_task', float('nan')):.2f} | "
                  f"{s.get('finish_rate', float('nan')):.2f} |")
    print("\nafter RL, arm against arm (same tasks and random numbers): difference ± s.e. over tasks (samples' luck)")
    between: dict[tuple[str, str], list[float]] = {pair: [] for pair in PAIRS}
    for seed, arms in runs.items():
        cells = []
        for a, b in PAIRS:
            if a in arms and b in arms:
                d = paired_difference(arms[b][1], arms[a][1])  # a - b
                between[(a, b)].append(d.diff)
                cells.append(f"{a} - {b} {d.diff:+.3f} ± {over_tasks(d).se_paired:.3f} ({d.se_paired:.3f})")
        print(f"seed {seed}: " + ("; ".join(cells) or "no pair of arms finished"))
    print("\nover seeds (mean, sample sd, 95% t-interval; only where two or more seeds have the arm or pair):")
    for arm in ARMS:
        if len(gains[arm]) > 1:
            print(f"  RL - warm, {arm} ({len(gains[arm])} seeds): {seed_spread(gains[arm]).format(signed=True)}")
    for (a, b), xs in between.items():
        if len(xs) > 1:
            s = seed_spread(xs)
            print(f"  after RL, {a} - {b} ({len(xs)} seeds): {s.format(signed=True)}: {s.in_words()}")


if __name__ == "__main__":
    main()
