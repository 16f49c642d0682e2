"""Transfer over seeds: `benchmarks/transfer.py` runs (one per seed) combined into a mean with its spread.

    .venv/bin/python benchmarks/transfer_seeds.py runs/transfer/seed2 runs/transfer/seed3 runs/transfer/seed4
    .venv/bin/python benchmarks/transfer_seeds.py docs/results/transfer/seed{2,3,4_8steps}.json   # the recorded seeds

Per run (its transfer.json): the held-out pass@1 gain, warm start -> after RL, of the templates RL
trained on and of the control (the other templates), each ± its paired standard error (sampling
noise inside that seed's evals), their difference (what RL on the templates bought beyond whatever it
did to every task), and how many held-out tasks were solved more and less often after RL, with an
exact two-sided sign test of that seed's split. Over runs: the mean, the sample standard deviation
over seeds and the 95% Student t-interval of the mean (`carl.eval.seeds`), the range and how many
seeds gained, and whether the interval excludes 0. Task counts are not pooled over seeds into one
test: the seeds, not the tasks, are the replicates of an RL run. Per template, the same over the
seeds that recorded it. Results go to <out>/transfer_seeds.json and <out>/transfer_seeds.png
(--out defaults to the first run's parent).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import sign_test
from transfer import CONTROL, SAME, template_group

from carl.eval.seeds import seed_spread


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, nargs="+",
                   help="finished `benchmarks/transfer.py` --out directories, or their transfer.json files "
                        "(with a top-level \"seed\")")
    p.add_argument("--out", type=Path, help="where to write transfer_seeds.json and .png")
    args = p.parse_args()
    runs = [load_run(d) for d in args.runs]
    if len({tuple(r["templates"]) for r in runs}) > 1:
        raise SystemExit("the runs trained on different templates: "
                         + ", ".join(f"{r['dir']}: {','.join(r['templates'])}" for r in runs))
    result = combine(runs)
    print_result(result)
    out = args.out or args.runs[0].resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "transfer_seeds.json").write_text(json.dumps(result, indent=2))
    plot(result, out / "transfer_seeds.png")


def load_run(run_dir: Path) -> dict:
    """A finished transfer run (its --out directory, or a transfer.json kept elsewhere): its seed,
    templates and per-group paired differences."""
    path = run_dir if run_dir.suffix == ".json" else run_dir / "transfer.json"
    if not path.exists():
        raise SystemExit(f"{path}: not found; is {run_dir} a finished `benchmarks/transfer.py --out` directory? "
                         "(it writes transfer.json after both evals)")
    saved = json.loads(path.read_text())
    missing = {SAME, CONTROL} - set(saved.get("groups", {}))
    if missing:
        raise SystemExit(f"{path}: groups {sorted(missing)} missing; expected a transfer.py summary")
    config = path.parent / "transfer_config.toml"
    seed = saved.get("seed", tomllib.loads(config.read_text()).get("seed") if config.exists() else None)
    return {"dir": str(run_dir), "seed": seed, "templates": saved["templates"], "groups": saved["groups"]}


def combine(runs: list[dict]) -> dict:
    """Per run and over runs: the same-template gain, the control's, and same - control."""
    per_run = []
    for r in runs:
        same, control = r["groups"][SAME], r["groups"][CONTROL]
        per_run.append({"dir": r["dir"], "seed": r["seed"],
                        "same": same["diff"], "same_se": same["se_paired"],
                        "control": control["diff"], "control_se": control["se_paired"],
                        "same_minus_control": same["diff"] - control["diff"],
                        "same_minus_control_se": (same["se_paired"] ** 2 + control["se_paired"] ** 2) ** 0.5,
                        "warm_same": same["pass_a"], "rl_same": same["pass_b"],
                        "better": same["tasks_better"], "worse": same["tasks_worse"],
                        "sign_test_p": sign_test(same["tasks_better"], same["tasks_worse"]),
                        "control_better": control["tasks_better"], "control_worse": control["tasks_worse"]})
    over = {}
    for key in ("same", "control", "same_minus_control", "warm_same", "rl_same"):
        xs = [r[key] for r in per_run]
        over[key] = seed_spread(xs).to_dict() | {"min": min(xs), "max": max(xs), "positive": sum(x > 0 for x in xs)}
    templates = {}
    for name in runs[0]["templates"]:
        group = template_group(name, trained=True)
        diffs = [r["groups"][group]["diff"] for r in runs if group in r["groups"]]
        if not diffs:
            continue
        templates[name] = seed_spread(diffs).to_dict() | {"diffs": diffs}
    return {"templates": runs[0]["templates"], "runs": per_run, "over_seeds": over, "per_template": templates}


def print_result(result: dict) -> None:
    print(f"held-out pass@1 gain (after RL - warm start), RL on templates {','.join(result['templates'])}; "
          "± paired standard error (sampling noise inside the seed's evals only)")
    print(f"{'seed':>5} {'same templates':>26} {'control':>17} {'same - control':>17}  {'better/worse':>12} "
          f"{'sign test':>9}")
    for r in result["runs"]:
        print(f"{r['seed']!s:>5} {r['warm_same']:.3f}->{r['rl_same']:.3f} {r['same']:+.3f}±{r['same_se']:.3f} "
              f"{r['control']:>+11.3f}±{r['control_se']:.3f} "
              f"{r['same_minus_control']:>+11.3f}±{r['same_minus_control_se']:.3f}  {r['better']:>10}/{r['worse']} "
              f"p={r['sign_test_p']:.2g}")
    runs, o = result["runs"], result["over_seeds"]
    print(f"over {len(runs)} seeds: mean (sample sd over seeds, 95% t-interval of the mean); range; seeds > 0")
    for key, label, signed in (("warm_same", "same templates, warm start pass@1", False),
                               ("rl_same", "same templates, after-RL pass@1", False),
                               ("same", "same templates, gain", True), ("control", "control, gain", True),
                               ("same_minus_control", "same - control", True)):
        s, f = seed_spread([r[key] for r in runs]), "+.3f" if signed else ".3f"
        print(f"  {label:<34} {s.format(signed)}; range {o[key]['min']:{f}} .. {o[key]['max']:{f}}; "
              f"{o[key]['positive']}/{len(runs)}")
        if signed:
            print(f"  {'':<34} {s.in_words()}")
    print("  per template, gain over the seeds that recorded it:")
    for name, t in result["per_template"].items():
        print(f"    {name:<32} {seed_spread(t['diffs']).format(signed=True)}")


def plot(result: dict, path: Path) -> None:
    """Per seed, the same-template and control gains with their paired standard errors."""
    runs = result["runs"]
    plot_per_seed([(label, [r[key] for r in runs], [r[f"{key}_se"] for r in runs], result["over_seeds"][key]["mean"])
                   for key, label in (("same", "same templates (trained on)"), ("control", "other templates"))],
                  [r["seed"] for r in runs], "held-out pass@1: after RL - warm start",
                  f"RL on {','.join(result['templates'])}; dashed: mean over seeds", path)


def plot_per_seed(series: list[tuple[str, list[float], list[float], float]], seeds: list, ylabel: str, title: str,
                  path: Path) -> None:
    """One point per seed for each (label, values, standard errors, mean over seeds) of `series`, side by
    side, with the mean dashed in the series' colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, values, ses, mean) in enumerate(series):
        xs = [j + (i - 0.5) * 0.3 for j in range(len(seeds))]
        ax.errorbar(xs, values, yerr=ses, fmt="o", capsize=4, color=f"C{i}", label=label)
        ax.axhline(mean, color=f"C{i}", linestyle="--", linewidth=0.8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    ax.set_xlim(-0.6, len(seeds) - 0.4)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")

if __name__ == "__main__":
    main()
