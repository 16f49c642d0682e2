"""Can RL fit its own tasks? From a finished run's warm start, RL on K of its RL tasks, scored on the same K.

    .venv/bin/python benchmarks/fit.py runs/learning/seed2_grpo+errcost --out runs/fit/seed2 \
        rollout.group_size=8 rollout.tasks_per_step=4 rl.steps=8

A check of the optimizer apart from generalization: if RL cannot raise pass@1 on the very tasks it
trains on, held-out results say nothing about transfer. The run branches from the finished run's
warm-start checkpoint (step 0) as `benchmarks/learning.py` arms do, picks --tasks of its RL tasks
(one per repo in turn), scores the warm start on them (`carl eval`, --samples per task, sampler
--seed), then trains with those tasks as both the RL and the eval set (the finished run's config,
then the overrides). Printed: pass@1 on the K tasks before and after RL, per task, and the RL
rollouts' pass rate per step. A finished step is reused, so an interrupted run resumes.

Cost on 2 CPU cores (SmolLM2-135M, G=8 x 4 tasks, another run beside it): 3.5-7 minutes per RL
step (measured 205-427 s), a few minutes per 32-episode eval.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import branch_from

from carl.io import atomic_write_json, atomic_write_jsonl, read_jsonl
from carl.tasks import TaskRecord, load_tasks, write_tasks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", type=Path, help="a finished `carl train` run directory (with its step-0 checkpoint)")
    p.add_argument("--tasks", type=int, default=4, help="RL tasks to fit (one per repo in turn)")
    p.add_argument("--samples", type=int, default=8, help="eval samples per task, before and after RL")
    p.add_argument("--seed", type=int, default=None,
                   help="sampler seed of the warm start's eval (default: the run's seed, which the RL checkpoint's "
                        "eval inside `carl train` uses, so the two are paired on common random numbers)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("overrides", nargs="*", help="dotted overrides on top of the finished run's config")
    args = p.parse_intermixed_args()  # overrides may follow the options
    if args.tasks < 1 or args.samples < 1:
        p.error(f"--tasks and --samples: got {args.tasks} and {args.samples}, expected >= 1")

    from carl.cli import main as carl
    from carl.config import load_config, save_config
    from carl.train.config import TrainConfig
    from carl.train.loop import train

    files = dict(o.split("=", 1) for o in branch_from(args.first, args.out))
    drop_held_out_eval(args.out)
    subset = args.out / "fit_tasks.jsonl"
    if not subset.exists():
        write_tasks(subset, pick_tasks(load_tasks(files["rl_tasks"], require_repos=True), args.tasks))
    cfg = load_config(TrainConfig, args.first / "config.toml", [
        f"run_dir={args.out}", f"tasks={files['tasks']}", f"rl_tasks={subset}", f"eval_tasks={subset}",
        f"eval.samples_per_task={args.samples}", *args.overrides])
    save_config(cfg, args.out / "fit_config.toml")  # the warm start is scored as the RL checkpoint will be
    warm = args.out / "fit_warm.json"
    if not warm.exists():
        code = carl(["eval", "--checkpoint", str(args.out / "checkpoints" / "step_000000"), "--tasks", str(subset),
                     "--run-config", str(args.out / "fit_config.toml"),
                     "--seed", str(cfg.seed if args.seed is None else args.seed), "--out", str(warm)])
        if code:
            raise SystemExit(f"the warm start's eval failed (exit {code})")
        use_as_warm_start_eval(args.out, json.loads(warm.read_text()))
    if not (args.out / "report.json").exists():
        train(cfg)
    print_summary(args.out, warm)


def pick_tasks(tasks: list[TaskRecord], k: int, key=lambda t: t.repo) -> list[TaskRecord]:
    """k tasks, one per repo (or other `key`) in turn, keys and their tasks in id order, so that a
    few tasks span repos."""
    by_key: dict[str, list[TaskRecord]] = {}
    for t in sorted(tasks, key=lambda t: t.instance_id):
        by_key.setdefault(key(t), []).append(t)
    picked: list[TaskRecord] = []
    while len(picked) < k and any(by_key.values()):
        for name in sorted(by_key):
            if by_key[name] and len(picked) < k:
                picked.append(by_key[name].pop(0))
    return picked


def drop_held_out_eval(run_dir: Path) -> None:
    """A branch starts with the finished run's held-out eval of step 0; this run scores other tasks."""
    (run_dir / "eval" / "step000000.json").unlink(missing_ok=True)
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        rows = [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in read_jsonl(metrics)]
        atomic_write_jsonl(metrics, rows)


def use_as_warm_start_eval(run_dir: Path, report: dict) -> None:
    """Make `report` (the warm start scored on the fitted tasks) the branch's step-0 eval: its
    per-task report, and the warm-start entry of the final table (kept in the checkpoint's state)."""
    import torch

    atomic_write_json(run_dir / "eval" / "step000000.json", report)
    path = run_dir / "checkpoints" / "step_000000" / "trainer.pt"
    blob = torch.load(path, weights_only=False)
    blob["trainer_state"]["reports"] = {"warm_start": report}
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)


def print_summary(run_dir: Path, warm_path: Path) -> None:
    warm = json.loads(warm_path.read_text())
    after = json.loads(max((run_dir / "eval").glob("step*.json")).read_text())
    passes = {t["task_id"]: [t["passed"], t["n"]] for t in warm["tasks"]}
    for t in after["tasks"]:
        passes.setdefault(t["task_id"], [0, 0]).extend([t["passed"], t["n"]])
    print(f"\nRL on its own {len(passes)} tasks: pass@1 {warm['summary']['pass@1']:.3f} (warm start) -> "
          f"{after['summary']['pass@1']:.3f} (after RL)")
    for task_id, p in sorted(passes.items()):
        print(f"  {task_id}: {p[0]}/{p[1]} -> " + (f"{p[2]}/{p[3]}" if len(p) == 4 else "not scored"))
    rates = [r["rl/pass_rate"] for r in read_jsonl(run_dir / "metrics.jsonl") if "rl/pass_rate" in r]
    print("RL rollouts' pass rate per step: " + " ".join(f"{x:.2f}" for x in rates))


if __name__ == "__main__":
    main()
