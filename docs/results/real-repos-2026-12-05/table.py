"""Every checkpoint of the embedded default scored so far on the 12-task smoke subset of the
`small-cpu` suite (tabulate, cachetools, h11, toolz; one lock, so the same 12 tasks in every row), 2
samples a task, every sample kept in the JSON files named. Run from the repository root:
    python3 docs/results/real-repos-2026-12-05/table.py
"""
import json
from pathlib import Path

RESULTS = Path(__file__).parent.parent
LOCK = "808ff530a2f0e633c9e5da15ce8bcf1b4ed53a914cfa7d1e26e9134275b49fdf"  # small.lock.json's sha256
ROWS = [
    ("bench/smollm2-small-cpu/step0.json", "level-4 demo (2026-12-02): warm start"),
    ("bench/smollm2-small-cpu/step5.json", "level-4 demo (2026-12-02): RL"),
    ("bench/smollm2-small-cpu/step5_seed1.json", "level-4 demo (2026-12-02): RL, sampler seed 1"),
    ("midtrain-bench-2026-12-05/bench/smollm2.json", "SmolLM2-135M-Instruct as shipped"),
    ("midtrain-bench-2026-12-05/bench/midtrain.json", "after 200 mid-training steps"),
    ("midtrain-bench-2026-12-05/bench/base-warm.json", "all-template demo (b910ba2): warm start"),
    ("midtrain-bench-2026-12-05/bench/base-rl.json", "all-template demo (b910ba2): RL"),
    ("midtrain-bench-2026-12-05/bench/mid-warm.json", "the same from the mid-trained model: warm start"),
    ("midtrain-bench-2026-12-05/bench/mid-rl.json", "the same from the mid-trained model: RL"),
    ("real-repos-2026-12-05/c954498-warm.json", "two-rule demo (c954498, 1d4254d): warm start"),
    ("real-repos-2026-12-05/c954498-rl.json", "two-rule demo c954498: RL (held-out micro +0.625)"),
    ("real-repos-2026-12-05/1d4254d-rl.json", "two-rule demo 1d4254d: RL (held-out micro +0.406)"),
    ("real-repos-2026-12-07/seed10-warm.json", "64-episode default, fresh seed 10: warm start"),
    ("real-repos-2026-12-07/seed10-rl.json", "64-episode default, fresh seed 10: RL (held-out micro +0.435)"),
    ("real-repos-2026-12-07/seed12-warm.json", "64-episode default, fresh seed 12: warm start"),
    ("real-repos-2026-12-07/seed12-rl.json", "64-episode default, fresh seed 12: RL (held-out micro +0.346)"),
]


def main() -> None:
    print("| checkpoint | file | passed | pass@1, 95% interval | tool calls a task | finished | tokens out a task |")
    print("|---|---|---|---|---|---|---|")
    passed = samples = 0
    for path, what in ROWS:
        s = json.loads((RESULTS / path).read_text())["summary"]
        assert (s["suite_lock_sha256"], s["smoke"], s["num_tasks"]) == (LOCK, True, 12), path  # the same 12 tasks
        passed, samples = passed + s["passed"], samples + s["samples"]
        print(f"| {what} | `{path}` | {s['passed']} of {s['samples']} | {s['pass@1']:.3f}, "
              f"{s['ci95'][0]:.3f}-{s['ci95'][1]:.3f} | {s['tool_calls_per_task']:.1f} | "
              f"{s['stop_reasons'].get('finished', 0)} of {s['samples']} | {s['tokens_per_task']:.0f} |")
    print(f"\n{passed} of {samples} episodes passed over the {len(ROWS)} checkpoints.")


if __name__ == "__main__":
    main()
