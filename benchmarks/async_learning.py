"""Does asynchronous RL learn as well as synchronous RL? The template-transfer protocol, both ways.

    .venv/bin/python benchmarks/async_learning.py --seeds 1 2 3 --out runs/async_l1 \
        --warm micro.difficulty=1 --warm eval.samples_per_task=1 --eval-repos 36 --control 6 --samples 2 \
        rl.steps=4 rollout.group_size=8 rollout.tasks_per_step=4     # docs/pipeline.md, 2026-12-05
    .venv/bin/python benchmarks/async_learning.py --seeds 1 2 3 --out runs/async_l1 --report-only

Per seed: one warm start (`carl train seed=N micro.seed=N rl.steps=0` and the --warm overrides), then
`benchmarks/transfer.py` twice from it (RL on --templates, scored on unseen tasks of them and of the other templates), once
with rollout.max_staleness=0 (synchronous) and once with --staleness (default 2), the same tasks,
seed, steps and number of rollouts in both (no dynamic sampling: rollout.max_extra_batches=0;
rl.steps alone bounds RL: rl.max_rollouts=0). The
warm start's eval is made once per seed and shared by both arms (same checkpoint, tasks and sampler
seed, so it is the same eval); the two after-RL evals share the sampler's random numbers.

Printed per seed: each arm's same-template gain (after RL - warm start) with its paired standard
error, and async - sync on the same-template tasks, paired sample by sample. Over seeds: the mean of
each, the sample standard deviation over seeds and the 95% t-interval of the mean
(carl.eval.seeds). Results: <out>/async_learning.json (per seed: both arms' transfer.json groups;
the per-sample outcomes are the arms' eval reports under <out>/seedN/{sync,async}/eval/).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from transfer import SAME, template  # noqa: E402
from transfer_seeds import plot_per_seed  # noqa: E402

from carl.eval.paired import paired_difference  # noqa: E402
from carl.eval.seeds import seed_spread  # noqa: E402
from carl.io import atomic_write_json, read_jsonl  # noqa: E402
from carl.tasks import load_tasks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--templates", default="add,mul,total,affine")
    p.add_argument("--staleness", type=int, default=2, help="the async arm's rollout.max_staleness")
    p.add_argument("--warm", action="append", default=[], metavar="KEY=VALUE",
                   help="an override (repeat the option for more) for every seed's warm start, e.g. "
                        "micro.difficulty=1 (the default world is "
                        "level 4, whose templates are shift, scale, clamp, tag, fits, count_over, total, "
                        "clamp_all, tag_all; --templates' default names level-1 templates)")
    for flag, default in (("--rl-repos", 48), ("--eval-repos", 36), ("--control", 16), ("--samples", 4)):
        p.add_argument(flag, type=int, default=default, help=f"transfer.py's {flag} (default {default})")
    p.add_argument("--report-only", action="store_true", help="summarize finished seeds, train nothing")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE for both arms' RL (transfer.py overrides), e.g. "
                                                "rl.steps=8 rollout.group_size=8 rollout.tasks_per_step=4")
    args = p.parse_intermixed_args()
    if args.staleness < 1:
        p.error(f"--staleness: got {args.staleness}, expected >= 1 (0 is the synchronous arm)")
    arms = {"sync": 0, "async": args.staleness}
    results = []
    for seed in args.seeds:
        root = args.out / f"seed{seed}"
        if not args.report_only:
            warm = root / "warm"
            if not (warm / "report.json").exists():
                run([sys.executable, "-m", "carl", "train", f"seed={seed}", f"micro.seed={seed}", "rl.steps=0",
                     "micro.templates=[]", *args.warm, f"run_dir={warm}"])  # transfer.py picks the templates
            for name, s in arms.items():
                out = root / name
                shared = root / "sync" / "transfer_warm.json"
                if name != "sync" and shared.exists() and not (out / "transfer_warm.json").exists():
                    out.mkdir(parents=True, exist_ok=True)
                    shutil.copy(shared, out / "transfer_warm.json")  # the same eval: made once per seed
                if not (out / "transfer.json").exists():
                    run([sys.executable, str(Path(__file__).parent / "transfer.py"), str(warm), "--templates",
                         args.templates, "--warm-eval", "before", "--out", str(out), "--rl-repos", str(args.rl_repos),
                         "--eval-repos", str(args.eval_repos), "--control", str(args.control),
                         "--samples", str(args.samples), *args.overrides,
                         f"rollout.max_staleness={s}", "rollout.max_extra_batches=0", "rl.max_wall_s=0",
                         "rl.max_rollouts=0"])
        if all((root / name / "transfer.json").exists() for name in arms):
            results.append(seed_result(seed, root, arms))
        else:
            print(f"seed {seed}: not finished, left out")
    if not results:
        raise SystemExit("no seed has finished both arms")
    summary = summarize(results)
    print_summary(results, args.staleness)
    plot(results, args.staleness, args.out / "async_learning.png")
    atomic_write_json(args.out / "async_learning.json", {"templates": args.templates, "staleness": args.staleness,
                                                        "overrides": args.overrides, "seeds": results,
                                                        "over_seeds": summary})


def run(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd)
    if code != 0:
        raise SystemExit(f"exit {code}: {' '.join(cmd)}")


def seed_result(seed: int, root: Path, arms: dict[str, int]) -> dict:
    """Both arms' same-template gains, and async - sync on the same tasks (paired sample by sample)."""
    out = {"seed": seed}
    after = {}
    for name in arms:
        saved = json.loads((root / name / "transfer.json").read_text())
        same = saved["groups"][SAME]
        rows = read_jsonl(root / name / "metrics.jsonl")
        out[name] = {"gain": same["diff"], "se": same["se_paired"], "warm": same["pass_a"], "rl": same["pass_b"],
                     "rl_pass_rate": saved.get("rl_pass_rate"), "groups": saved["groups"],
                     "rollouts": max((r["rl/rollouts_total"] for r in rows if "rl/rollouts_total" in r), default=0),
                     # how off-policy the arm's RL was: per step, the mean and max versions behind of its tokens
                     "staleness_token_mean": [r["staleness/token_mean"] for r in rows if "staleness/token_mean" in r],
                     "staleness_token_max": [r["staleness/token_max"] for r in rows if "staleness/token_max" in r]}
        after[name] = json.loads(max((root / name / "eval").glob("step*.json")).read_text())
    templates = set(json.loads((root / "sync" / "transfer.json").read_text())["templates"])
    same_ids = {t.instance_id for t in load_tasks(root / "sync" / "transfer_eval.jsonl") if template(t) in templates}
    d = paired_difference(*({"tasks": [t for t in r["tasks"] if t["task_id"] in same_ids]}
                            for r in (after["sync"], after["async"])))
    out["async_minus_sync"] = {"diff": d.diff, "se": d.se_paired, "sync": d.pass_a, "async": d.pass_b,
                               "tasks": d.tasks, "pairs": d.pairs}
    return out


def series(results: list[dict]) -> dict[str, list[float]]:
    """One value per seed of each summarized quantity."""
    return {"sync gain": [r["sync"]["gain"] for r in results], "async gain": [r["async"]["gain"] for r in results],
            "async - sync": [r["async_minus_sync"]["diff"] for r in results]}


def summarize(results: list[dict]) -> dict:
    return {key: seed_spread(values).to_dict() | {"values": values} for key, values in series(results).items()}


def print_summary(results: list[dict], staleness: int) -> None:
    print(f"\nheld-out pass@1 on the trained templates, warm start -> after RL (± paired SE, sampling noise "
          f"inside the seed's evals); async = max_staleness {staleness}")
    print(f"{'seed':>5} {'sync':>24} {'async':>24} {'async - sync':>16}")
    for r in results:
        s, a, d = r["sync"], r["async"], r["async_minus_sync"]
        print(f"{r['seed']:>5} {s['warm']:.3f}->{s['rl']:.3f} {s['gain']:+.3f}±{s['se']:.3f} "
              f"{a['warm']:.3f}->{a['rl']:.3f} {a['gain']:+.3f}±{a['se']:.3f} {d['diff']:>+10.3f}±{d['se']:.3f}")
        stale = a["staleness_token_mean"]
        print(f"{'':>5} rollouts {s['rollouts']:.0f} and {a['rollouts']:.0f}; async tokens' staleness per step "
              f"{' '.join(f'{x:.2f}' for x in stale)} (max {max(a['staleness_token_max'], default=0):.0f})")
    print(f"over {len(results)} seeds: mean (sample sd over seeds, 95% t-interval of the mean)")
    for label, values in series(results).items():
        spread = seed_spread(values)
        print(f"  {label:<14} {spread.format(signed=True)}; {spread.in_words()}")


def plot(results: list[dict], staleness: int, path: Path) -> None:
    """Per seed, each arm's same-template gain with its paired standard error; dashed: the mean over seeds."""
    summary = summarize(results)
    plot_per_seed([(label, [r[name]["gain"] for r in results], [r[name]["se"] for r in results],
                    summary[f"{name} gain"]["mean"])
                   for name, label in (("sync", "synchronous"), ("async", f"max_staleness {staleness}"))],
                  [r["seed"] for r in results], "held-out pass@1, trained templates:\nafter RL - warm start (± paired SE)",
                  "synchronous vs asynchronous RL at equal rollouts; dashed: mean over seeds", path)

if __name__ == "__main__":
    main()
