"""Synchronous vs asynchronous RL, the same run side by side: max_staleness 0, 1 and 2.

    .venv/bin/python benchmarks/async.py --first runs/warm --out runs/async --steps 4
    .venv/bin/python benchmarks/async.py --first runs/warm --out runs/async --staleness 0,2 engine.kind=hf

`--first` is a finished run whose warm-start checkpoint every arm branches from (`carl train
--branch-from FIRST:0`), e.g. one made with `carl train run_dir=runs/warm rl.steps=0`. Every arm
trains `--steps` RL steps on the same tasks with the same seed and a fixed number of rollouts
(rollout.max_extra_batches=0), differing only in rollout.max_staleness, each in a process of its own
(so that no arm pays another's start-up; until 2026-12-04 they shared one, and the first arm paid
CUDA's warm-up in its first step). `--report-only` summarizes what the arms' metrics hold so far
(arms a time limit cut included). Reported per arm, from its
metrics.jsonl: seconds per step (mean of steps 2.., the first includes warm-up), the trainer's idle
fraction (time it waited for rollouts), the engine's idle fraction (time with no request in flight),
groups dropped, the tokens' staleness, rollouts per hour of RL wall time, that rate as a ratio
to the synchronous arm's, and the ratio of seconds per step over steps 2.. alone (in a short run
the first step of an async arm waits while the engine also starts the next batches, so the
first ratio understates a long run's gain and the second overstates it). Results go to
--out/async.json with every arm's per-step rows.

Separate devices. Here trainer and engine share 2 CPU cores, so an async run overlaps them only as
far as the cores allow. With the engine on its own device, a step of the synchronous loop costs
rollout + train + sync seconds and a step of the pipelined one max(rollout, train + sync) (the
trainer never waits once rollouts run a step ahead, and the engine never waits while the trainer
trains, as long as S >= 1). The projection applies that model to the synchronous arm's own
measured rollout, train and sync times; it states the model, it does not measure a GPU. It also
leaves out what an engine gains from more episodes in flight: on one H200 with the HF engine (trainer
on the same GPU) it projected 1.11x and 1.22x where steps 2.. ran 2.36x and 1.70x faster, because a
synchronous step ends with a few slow episodes decoding alone (docs/pipeline.md, "On one GPU").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carl.io import atomic_write_json, read_jsonl  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", type=Path, required=True, help="a finished run to branch every arm from")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--staleness", default="0,1,2", help="comma-separated max_staleness values")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: summarize the arms' metrics so far (e.g. of arms a time limit cut)")
    p.add_argument("overrides", nargs="*", help="more KEY=VALUE for every arm")
    args = p.parse_args()
    arms = [int(s) for s in args.staleness.split(",")]
    if not arms or min(arms) < 0:
        p.error(f"--staleness: got {args.staleness!r}, expected non-negative integers such as 0,1,2")

    root = str(Path(__file__).resolve().parents[1])  # carl from this checkout, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    results = {}
    for s in arms:
        run = args.out / f"staleness{s}"
        t0 = time.monotonic()
        if args.report_only:
            metrics = run / "metrics.jsonl"
            if not metrics.exists() or not any("rl/reward_mean" in r for r in read_jsonl(metrics)):
                print(f"arm max_staleness={s}: no RL step in {run}", file=sys.stderr)
                continue
        elif not (run / "report.json").exists():
            # each arm in a process of its own, so that none pays another's start-up (CUDA's included)
            code = subprocess.run([sys.executable, "-m", "carl", "train", str(args.first / "config.toml"),
                                   f"run_dir={run}", f"rl.steps={args.steps}", f"rollout.max_staleness={s}",
                                   "rollout.max_extra_batches=0", "rl.max_wall_s=0", *args.overrides,
                                   "--branch-from", f"{args.first}:0"], env=env).returncode
            if code != 0:
                raise SystemExit(f"arm max_staleness={s} failed (exit {code}); see {run}")
        results[s] = summarize(run, float("nan") if args.report_only else time.monotonic() - t0)
    sync = results.get(0)
    for s, r in results.items():
        if sync:
            r["rollouts_per_hour_vs_sync"] = r["rollouts_per_hour"] / sync["rollouts_per_hour"]
            r["later_steps_vs_sync"] = sync["step_s_mean"] / r["step_s_mean"]
    out = {"first": str(args.first), "steps": args.steps, "overrides": args.overrides,
           "machine": "unknown (--report-only)" if args.report_only else machine(), "arms": results}
    if sync:
        out["projection_separate_devices"] = projection(sync)
    atomic_write_json(args.out / "async.json", out)
    report(out)


def summarize(run: Path, wall_s: float) -> dict:
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "rl/reward_mean" in r]
    later = rows[1:] or rows  # step 1 carries the engine's warm-up and the first sync's snapshot

    def mean(key: str, rs=later) -> float:
        xs = [r[key] for r in rs if key in r]
        return statistics.fmean(xs) if xs else float("nan")

    cfg = _config(run)
    per_step = cfg["rollout"]["group_size"] * cfg["rollout"]["tasks_per_step"]
    rollouts = per_step * len(rows)
    rl_wall = sum(r["time/step_s"] for r in rows)
    return {
        "steps": len(rows),
        "step_s_mean": mean("time/step_s"),
        "rollout_wait_s_mean": mean("time/rollout_wait_s"),
        "train_s_mean": mean("time/train_s"),
        "sync_s_mean": mean("sync/total_s"),
        "trainer_idle_frac": mean("time/trainer_idle_frac"),
        "engine_idle_frac": 1 - mean("engine/busy_frac"),
        "groups_dropped": sum(r.get("rl/groups_dropped", 0.0) for r in rows),
        "staleness_token_mean": mean("staleness/token_mean", rows),
        "staleness_token_max": max((r.get("staleness/token_max", 0.0) for r in rows), default=0.0),
        "rollouts": rollouts,
        "rl_wall_s": rl_wall,
        "rollouts_per_hour": 3600 * rollouts / rl_wall,
        "pass_rate_mean": mean("rl/pass_rate", rows),
        "arm_wall_s": wall_s,
        "rows": rows,
    }


def machine() -> str:
    """Where the arms ran: the GPU's name when there is one, and the CPU cores."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{gpu}, {os.cpu_count()} CPU cores"


def _config(run: Path) -> dict:
    import tomllib

    return tomllib.loads((run / "config.toml").read_text())


def projection(sync: dict) -> dict:
    """Rollouts/hour of a pipelined run on separate devices vs the synchronous one (see the module doc)."""
    roll, train, syn = sync["rollout_wait_s_mean"], sync["train_s_mean"], sync["sync_s_mean"]
    sync_step, async_step = roll + train + syn, max(roll, train + syn)
    return {"model": "sync step = rollout + train + sync; async step (S >= 1) = max(rollout, train + sync)",
            "rollout_s": roll, "train_s": train, "sync_s": syn, "sync_step_s": sync_step,
            "async_step_s": async_step, "speedup": sync_step / async_step}


def report(out: dict) -> None:
    print(f"\n{'staleness':>9} {'step s':>7} {'trainer idle':>12} {'engine idle':>11} {'dropped':>7} "
          f"{'stale tok':>9} {'rollouts/h':>10} {'vs sync':>7} {'2.. vs sync':>11}")
    for s, r in out["arms"].items():
        print(f"{s:>9} {r['step_s_mean']:>7.1f} {r['trainer_idle_frac']:>12.0%} {r['engine_idle_frac']:>11.0%} "
              f"{r['groups_dropped']:>7.0f} {r['staleness_token_mean']:>9.2f} {r['rollouts_per_hour']:>10.0f} "
              f"{r.get('rollouts_per_hour_vs_sync', float('nan')):>7.2f} "
              f"{r.get('later_steps_vs_sync', float('nan')):>11.2f}")
    print("step s: mean of steps 2..; rollouts/h and vs sync: every step, the first included (an async run's first "
          "step waits while the engine starts the next batches too); 2.. vs sync: the synchronous arm's seconds "
          "per step over this arm's, steps 2.. (a long run's gain lies between the two)")
    if "projection_separate_devices" in out:
        pr = out["projection_separate_devices"]
        print(f"separate devices (projected from the synchronous arm: rollout {pr['rollout_s']:.1f} s, train "
              f"{pr['train_s']:.1f} s, sync {pr['sync_s']:.1f} s per step): {pr['speedup']:.2f}x rollouts/hour")


if __name__ == "__main__":
    main()
