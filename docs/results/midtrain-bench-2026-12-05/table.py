"""The bench table of README.md from the six bench/*.json files (every sample is in them):
python docs/results/midtrain-bench-2026-12-05/table.py"""
import json
from pathlib import Path

here = Path(__file__).parent
rows = [("smollm2", "SmolLM2-135M-Instruct as shipped"), ("midtrain", "after 200 mid-training steps"),
        ("base-warm", "default demo: warm start"), ("base-rl", "default demo: RL"),
        ("mid-warm", "demo from the mid-trained model: warm start"), ("mid-rl", "demo from the mid-trained model: RL")]
print("| checkpoint | pass@1 (12 tasks x 2) | 95% interval | passed | tool calls a task | finished | tokens out a task | s a task |")
print("|---|---|---|---|---|---|---|---|")
for name, what in rows:
    s = json.loads((here / "bench" / f"{name}.json").read_text())["summary"]
    print(f"| {what} (`{name}`) | {s['pass@1']:.3f} | {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f} | {s['passed']} of {s['samples']} "
          f"| {s['tool_calls_per_task']:.1f} | {s['stop_reasons'].get('finished', 0)} of {s['samples']} "
          f"| {s['tokens_per_task']:.0f} | {s['wall_s_per_task']:.0f} |")
