"""Seeded RL rollouts (rollout.seeded, 2026-12-07) against unseeded ones: two RL draws of the default
(grpo+errcost) per seed from the same warm start, seeds 7 and 8, bf16 on a 2-core Zen 4.

    seeded:   seed<s>_a, seed<s>_b here (`carl train <warm start's config> run_dir=... --branch-from <run>:0`,
              code e5401be; the warm starts of docs/results/needspass-exec-bf16-2026-12-06)
    unseeded: the 2026-12-05 runs (two-rules-2026-12-05) and the 2026-12-06 runs
              (needspass-exec-bf16-2026-12-06) of the same seeds, from warm starts with the same pass@1

Printed per draw: each RL step's pass rate and generated tokens, RL - warm start on held-out pass@1 with
its standard error over tasks; per pair of draws: how many of the after-RL eval's episodes are the
same episode (digests) and the difference of the two RL - warm. Run from the repository root:
    .venv/bin/python docs/results/seeded-rl-2026-12-07/draws.py
"""
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).parent
spec = importlib.util.spec_from_file_location("gains", HERE.parent / "two-rules-2026-12-05" / "gains.py")
gains = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gains)  # (prints the 2026-12-05 tables first)
print("\n" + "=" * 100)

SEEDS = (7, 8)


def draws(seed: int) -> dict[str, Path]:
    return {"unseeded 12-05": HERE.parent / "two-rules-2026-12-05" / f"seed{seed}_grpo+errcost",
            "unseeded 12-06": HERE.parent / "needspass-exec-bf16-2026-12-06" / f"seed{seed}_grpo+errcost",
            "seeded a": HERE / f"seed{seed}_a", "seeded b": HERE / f"seed{seed}_b"}


def last_eval(run: Path) -> dict[str, list[str]]:
    evals = sorted((run / "eval").glob("step*.json"))
    return {t["task_id"]: t["digests"] for t in json.loads(evals[-1].read_text())["tasks"]}


def same_episodes(a: Path, b: Path) -> tuple[int, int]:
    x, y = last_eval(a), last_eval(b)
    pairs = [(p, q) for t in x for p, q in zip(x[t], y.get(t, []))]
    return sum(p == q for p, q in pairs), len(pairs)


for seed in SEEDS:
    runs = {name: run for name, run in draws(seed).items() if (run / "report.json").exists()}
    print(f"\nseed {seed}\n| draw | RL steps: pass rate (generated tokens) | warm | after RL | RL - warm ± s.e. over tasks |")
    print("|---|---|---|---|---|")
    gain = {}
    for name, run in runs.items():
        d, se_t, _ = gains.gain(run)
        gain[name] = d.diff
        steps = ", ".join(f"{r['rl/pass_rate']:.2f} ({r['engine/generated_tokens']:.0f})" for r in gains.rl_rows(run))
        print(f"| {name} | {steps} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se_t:.3f} |")
    for a, b in (("unseeded 12-05", "unseeded 12-06"), ("seeded a", "seeded b")):
        if a in runs and b in runs:
            same, n = same_episodes(runs[a], runs[b])
            print(f"{a} vs {b}: RL - warm differs by {gain[b] - gain[a]:+.3f}; after-RL eval: {same} of {n} "
                  "episodes the same episode")
