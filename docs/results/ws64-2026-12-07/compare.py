"""A warm start of 64 expert episodes (`warm_start.episodes=64`, arm grpo+errcost+ws64) against the
default's 32, everything else the default (seeded RL, 5 steps, at most 64 rollouts, the same 14-25
held-out tasks of the two rules a seed), recomputed from the kept per-sample evals:
  1. each ws64 run's RL - warm start, with its standard error over tasks (what `carl train`'s verdict
     uses) and the samples' luck alone; the count beyond 2 standard errors; the spread over seeds;
  2. the same for the default's two earlier draws of these seeds (2026-12-05 and 2026-12-06, bf16,
     one warm start per seed, RL drawn twice), read from their folders;
  3. ws64 against the default on the same held-out tasks, paired per seed: warm start against warm
     start, after RL against each default draw after RL.
Run from the repository root:
    .venv/bin/python docs/results/ws64-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SEEDS = (5, 6, 7, 8, 9)
WS64 = {s: HERE / f"seed{s}_grpo+errcost+ws64" for s in SEEDS}
DEFAULT = {  # the default's two draws of RL from one warm start per seed (same recipe, same tasks)
    "2026-12-05": {s: HERE.parent / "two-rules-2026-12-05" / f"seed{s}_grpo+errcost" for s in SEEDS},
    "2026-12-06": {s: HERE.parent / "needspass-exec-bf16-2026-12-06" / f"seed{s}_grpo+errcost" for s in SEEDS},
}


def evals(run: Path) -> tuple[dict, dict]:
    """The run's warm-start and after-RL eval reports (every sample's outcome)."""
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def rl_pass_rates(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["rl/pass_rate"] for r in rows if "rl/reward_mean" in r]


def spread(name: str, values: list[float], beyond: int | None = None) -> None:
    s = seed_spread(values)
    tail = f"; {beyond} of {len(values)} seeds beyond 2 s.e. over tasks" if beyond is not None else ""
    print(f"{name}: " + ", ".join(f"{v:+.3f}" for v in values)
          + f"\n  mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f} (n = {s.n}){tail}")


def gains(runs: dict[int, Path], title: str) -> dict[int, tuple[float, float]]:
    print(f"\n{title}\n| seed | held-out tasks | warm start | after RL | RL - warm ± s.e. over tasks (samples' luck) "
          "| z | tasks better / worse | RL steps' pass rates |")
    print("|---|---|---|---|---|---|---|---|")
    out, beyond = {}, 0
    for seed, run in runs.items():
        d = paired_difference(*evals(run))
        se = over_tasks(d).se_paired
        z = d.diff / se if se else 0.0
        beyond += z > 2
        out[seed] = (d.pass_a, d.pass_b)
        steps = ", ".join(f"{p:.2f}" for p in rl_pass_rates(run))
        print(f"| {seed} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} ({d.se_paired:.3f}) "
              f"| {z:.1f} | {d.tasks_better} / {d.tasks_worse} | {steps} |")
    spread("RL - warm start", [b - a for a, b in out.values()], beyond)
    return out


def against(a: dict[int, Path], b: dict[int, Path], which: int, title: str) -> list[float]:
    """b - a per seed on the same held-out tasks, paired over tasks; which = 0 warm start, 1 after RL."""
    print(f"\n{title}\n| seed | default | ws64 | ws64 - default ± s.e. over tasks | z |\n|---|---|---|---|---|")
    diffs = []
    for seed in SEEDS:
        d = paired_difference(evals(a[seed])[which], evals(b[seed])[which])
        se = over_tasks(d).se_paired
        diffs.append(d.diff)
        print(f"| {seed} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} | {d.diff / se if se else 0:.1f} |")
    spread("ws64 - default", diffs)
    return diffs


ws64 = gains(WS64, "ws64 (64 expert episodes), 2026-12-07, seeded RL")
for date, runs in DEFAULT.items():
    gains(runs, f"the default (32 expert episodes), draw of {date}, unseeded RL")
against(DEFAULT["2026-12-05"], WS64, 0, "warm start: ws64 against the default's (the same in both default draws)")
for date, runs in DEFAULT.items():
    against(runs, WS64, 1, f"after RL: ws64 against the default's draw of {date}")
