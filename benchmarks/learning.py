"""Does RL learn? Held-out pass@1 of the warm start vs after RL, over seeds, and GRPO alone vs
GRPO + self-distillation at the same number of rollouts (issue 4, "Evidence").

    .venv/bin/python benchmarks/learning.py                       # 3 seeds x {grpo, grpo+sd}
    .venv/bin/python benchmarks/learning.py --seeds 0 --arms grpo+sd rl.steps=2   # a quick look

Each (seed, arm) is one complete `carl train` run of the embedded default (or of the config
given with --config) in its own run directory under --out; a finished run is reused, so an
interrupted benchmark resumes. Both arms of a seed build the same micro world and the same warm
start from that seed (they differ only in rl.sd_weight), and run the same number of rollouts.
Printed per arm: warm-start and RL pass@1 (mean and spread over seeds), the RL - warm-start
difference, tokens per episode and the tool-call error rate of the RL rollouts.

Cost: one run of the default is about 17 minutes on 2 CPU cores, so the full benchmark
(3 seeds x 2 arms) takes about 1.7 hours there.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ARMS = {"grpo": ["rl.sd_weight=0.0"], "grpo+sd": []}  # grpo+sd keeps the default sd_weight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--config", default=None, help="a TOML config (default: the embedded default)")
    parser.add_argument("--out", default="runs/learning")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args()

    from carl.config import load_config
    from carl.train.config import TrainConfig
    from carl.train.loop import train

    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:
            run_dir = Path(args.out) / f"seed{seed}_{arm}"
            report = run_dir / "report.json"
            if not report.exists():
                overrides = [f"seed={seed}", f"micro.seed={seed}", f"run_dir={run_dir}", *ARMS[arm], *args.overrides]
                train(load_config(TrainConfig, args.config, overrides))
            summary = json.loads(report.read_text())
            rl_rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                       if "rl/reward_mean" in line]
            results[arm].append({
                "seed": seed,
                "warm": summary["warm_start"]["pass@1"],
                "rl": summary["rl"]["pass@1"],
                "tokens": statistics.mean(r["rl/generated_tokens_per_episode"] for r in rl_rows),
                "tool_errors": statistics.mean(r["rl/tool_error_rate"] for r in rl_rows),
            })

    print(f"\nheld-out pass@1 over seeds {args.seeds} (mean ± spread = population std)")
    print(f"{'arm':<9} {'warm start':>14} {'after RL':>14} {'RL - warm':>14} {'tokens/ep':>10} {'tool err':>9}")
    for arm, rows in results.items():
        warm, rl = [r["warm"] for r in rows], [r["rl"] for r in rows]
        diff = [b - a for a, b in zip(warm, rl)]
        print(f"{arm:<9} {_ms(warm):>14} {_ms(rl):>14} {_ms(diff):>14} "
              f"{statistics.mean(r['tokens'] for r in rows):>10.0f} "
              f"{statistics.mean(r['tool_errors'] for r in rows):>9.2f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "learning.json").write_text(json.dumps(results, indent=2))


def _ms(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f}±{statistics.pstdev(xs):.3f}"


if __name__ == "__main__":
    main()
