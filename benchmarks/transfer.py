"""Does RL transfer within a template? RL on many tasks of a few templates, scored on unseen ones.

    .venv/bin/python benchmarks/transfer.py runs/kl/seed2_grpo+errcost --templates add,sub,mul,total \
        --out runs/transfer/seed2 rl.steps=8

`benchmarks/fit.py` showed that RL learns the answers of the tasks it practises and that this does
not reach held-out tasks. This asks the question in between: the micro world writes every function
from one of a few docstring templates ("Return x plus {k}.": `add_<noun>`), so RL on many tasks of a
few templates, each task visited about once, can only raise its pass rate on them by learning the
templates. The held-out tasks of the same templates, from repos no training ever saw, then say
whether that transfers; held-out tasks of the other templates are the control.

From a finished run's warm start (step 0, as `benchmarks/learning.py` arms branch), this builds
--rl-repos RL repos and --eval-repos held-out repos of the run's micro world (the run's own held-out
repos are left out: their results may have picked the templates), keeps the RL tasks of
--templates (a template is the deleted function's name without its noun) and, as the held-out
set, all held-out tasks of those templates plus --control tasks of the others. It scores the warm
start on the held-out set with `carl eval` (the run's sampler seed, so that it is paired with the
RL checkpoint's eval inside `carl train`: common random numbers, see docs/training.md) while RL
trains beside it, then prints pass@1 before and after per group and per template, with the paired
standard error (`carl.eval.paired`). A finished stage is reused, so an interrupted run resumes.
Both evals get an episode time limit they do not reach (`eval.wall_time_s`, 3600 s by default;
until 2026-11-27 evals had the episodes' 300 s, which cut 93 of the warm start's 196 episodes
beside RL). `rl.max_wall_s` still counts RL's time, which the eval beside it slows.

Cost on 2 CPU cores (SmolLM2-135M, G=8 x 4 tasks): RL steps of 3.5-7 minutes, and two evals of
(held-out tasks x --samples) episodes, the warm start's beside RL.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit import drop_held_out_eval, pick_tasks
from learning import branch_from, continue_rl

from carl.eval.paired import paired_difference
from carl.io import atomic_write_json, read_jsonl
from carl.micro.world import template
from carl.tasks import TaskRecord, load_tasks, write_tasks

SAME, CONTROL = "same templates", "other templates (control)"  # transfer.json's group names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", type=Path, help="a finished `carl train` run directory (with its step-0 checkpoint)")
    p.add_argument("--templates", required=True, help="comma-separated templates to train on, e.g. add,sub")
    p.add_argument("--rl-repos", type=int, default=48, help="RL repos of the run's world to draw tasks from")
    p.add_argument("--eval-repos", type=int, default=36, help="held-out repos (the run's own are left out)")
    p.add_argument("--control", type=int, default=16, help="held-out tasks of other templates to score")
    p.add_argument("--samples", type=int, default=4, help="eval samples per held-out task")
    p.add_argument("--warm-eval", choices=["beside", "before"], default="beside",
                   help="score the warm start beside RL (two processes) or before it (one at a time)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--continue-rl", action="store_true",
                   help="a finished --out trains on to a larger rl.steps (also one the clock stopped); its "
                        "after-RL eval is made again, so copy the directory first to keep the shorter run's")
    p.add_argument("overrides", nargs="*", help="dotted overrides on top of the finished run's config")
    args = p.parse_intermixed_args()  # overrides may follow the options
    templates = [t for t in args.templates.split(",") if t]
    if not templates or min(args.rl_repos, args.eval_repos, args.samples) < 1 or args.control < 0:
        p.error(f"--templates {args.templates!r}, --rl-repos {args.rl_repos}, --eval-repos {args.eval_repos}, "
                f"--samples {args.samples}, --control {args.control}: expected templates and counts >= 1 "
                "(--control >= 0)")

    from carl.config import load_config, save_config
    from carl.train.config import TrainConfig
    from carl.train.loop import train

    files = dict(o.split("=", 1) for o in branch_from(args.first, args.out))
    drop_held_out_eval(args.out)
    rl_path, eval_path = args.out / "transfer_rl.jsonl", args.out / "transfer_eval.jsonl"
    if not eval_path.exists():
        rl, held_out = build_world(args.first, args.out / "world", args.rl_repos, args.eval_repos)
        own = {t.repo for t in load_tasks(files["eval_tasks"])}
        rl_set, same, control = pick(rl, [t for t in held_out if t.repo not in own], templates, args.control)
        if not rl_set or not same:
            raise SystemExit(f"templates {templates}: {len(rl_set)} RL and {len(same)} held-out tasks; "
                             f"known templates: {sorted({template(t) for t in rl})}")
        write_tasks(rl_path, rl_set)
        write_tasks(eval_path, same + control)
    cfg = load_config(TrainConfig, args.first / "config.toml", [
        f"run_dir={args.out}", f"tasks={files['tasks']}", f"rl_tasks={rl_path}", f"eval_tasks={eval_path}",
        f"eval.samples_per_task={args.samples}", *args.overrides])
    save_config(cfg, args.out / "transfer_config.toml")  # the warm start is scored as the RL checkpoint will be
    warm = args.out / "transfer_warm.json"
    scoring = None
    if not warm.exists():  # beside RL by default: the two share the cores, and neither waits for the other
        with open(args.out / "transfer_warm.log", "a") as log:  # the child keeps its own copy of the file
            scoring = subprocess.Popen(
                [sys.executable, "-m", "carl", "eval", "--checkpoint", str(args.out / "checkpoints" / "step_000000"),
                 "--tasks", str(eval_path), "--run-config", str(args.out / "transfer_config.toml"),
                 "--seed", str(cfg.seed), "--out", str(warm)],
                stdout=log, stderr=subprocess.STDOUT)
    if scoring is not None and args.warm_eval == "before":
        scoring.wait()
    if args.continue_rl and (args.out / "report.json").exists():
        step = continue_rl(args.out, cfg.rl.steps)
        print(f"RL ran {cfg.rl.steps} steps already" if step is None else
              f"continuing RL from step {step} to {cfg.rl.steps}", flush=True)
    if not (args.out / "report.json").exists():
        train(cfg)
    if scoring is not None and scoring.wait():
        raise SystemExit(f"the warm start's eval failed (exit {scoring.returncode}): {args.out / 'transfer_warm.log'}")
    print_summary(args.out, warm, templates)


def build_world(first: Path, out: Path, rl_repos: int, eval_repos: int) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """RL and held-out tasks of `first`'s micro world (its resolved [micro] settings), more repos of each."""
    from carl.micro.world import build_micro_tasks

    config = tomllib.loads((first / "config.toml").read_text())
    m, backend = config["micro"], config.get("sandbox", {}).get("backend", "bwrap")
    world = build_micro_tasks(out, m["seed"], m["difficulty"], {"rl": rl_repos, "eval": eval_repos},
                              m["modules_per_repo"], m["defs_per_module"], m["max_tasks_per_repo"], backend=backend,
                              progress=lambda split, s, r: r and print(f"  micro {split} repo {s}: {r.n_tasks} tasks"))
    return world["rl"], world["eval"]


def pick(rl: list[TaskRecord], held_out: list[TaskRecord], templates: list[str],
         control: int) -> tuple[list[TaskRecord], list[TaskRecord], list[TaskRecord]]:
    """RL tasks of `templates`; held-out tasks of them; `control` held-out tasks of the other templates,
    one per template in turn (templates and tasks in id order), so the control spans templates."""
    rl_set = [t for t in rl if template(t) in templates]
    same = [t for t in held_out if template(t) in templates]
    others = [t for t in held_out if template(t) not in templates]
    return rl_set, same, pick_tasks(others, control, key=template)


def template_group(name: str, trained: bool) -> str:
    """transfer.json's group name of one template (indented under SAME or CONTROL when printed)."""
    return ("  " if trained else "  (control) ") + name


def print_summary(run_dir: Path, warm_path: Path, templates: list[str], after_path: Path | None = None) -> None:
    """Warm start vs the RL checkpoint (`after_path`, default: the run's last eval), per group and template."""
    warm = json.loads(warm_path.read_text())
    after = json.loads((after_path or max((run_dir / "eval").glob("step*.json"))).read_text())
    names = {t.instance_id: template(t) for t in load_tasks(run_dir / "transfer_eval.jsonl")}
    rows: dict[str, dict] = {}

    def line(label: str, ids) -> None:
        if not ids:  # --control 0: no control group
            return
        d = paired_difference(*({"tasks": [t for t in r["tasks"] if t["task_id"] in ids]} for r in (warm, after)))
        rows[label] = {k: getattr(d, k) for k in d.__dataclass_fields__} | {"variance_ratio": d.variance_ratio}
        print(f"  {label:<26} {d.tasks:>3} tasks x {d.pairs / d.tasks:.1f}  {d.pass_a:.3f} -> {d.pass_b:.3f}  "
              f"{d.diff:+.3f} ± {d.se_paired:.3f} (unpaired ± {d.se_independent:.3f})  "
              f"better/worse {d.tasks_better}/{d.tasks_worse}  identical episodes {d.identical}/{d.pairs}")

    print(f"\nheld-out pass@1, warm start -> after RL on templates {','.join(templates)} "
          "(± paired standard error, sampling noise only):")
    line(SAME, {i for i, n in names.items() if n in templates})
    line(CONTROL, {i for i, n in names.items() if n not in templates})
    for name in sorted(set(names.values())):
        line(template_group(name, name in templates), {i for i, n in names.items() if n == name})
    rates = [r["rl/pass_rate"] for r in read_jsonl(run_dir / "metrics.jsonl") if "rl/pass_rate" in r]
    print("RL rollouts' pass rate per step: " + " ".join(f"{x:.2f}" for x in rates))
    # every episode's outcome ("1", "0", "x" = infrastructure failure) in sample order, warm start then
    # after RL: enough to recompute every paired difference above (carl.eval.paired)
    outcomes = {t["task_id"]: [t["outcomes"]] for t in warm["tasks"] if t["task_id"] in names}
    for t in after["tasks"]:
        outcomes.get(t["task_id"], []).append(t["outcomes"])
    atomic_write_json(run_dir / "transfer.json", {"templates": templates, "rl_pass_rate": rates, "groups": rows,
                                                  "outcomes": outcomes})


if __name__ == "__main__":
    main()
