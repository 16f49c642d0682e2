"""vLLM's KV-cache block size on a CPU: one run's held-out eval at several `engine.block_size`s.

    .venv/bin/python benchmarks/kv_blocks.py runs/default                        # 128 vs 32, twice
    .venv/bin/python benchmarks/kv_blocks.py runs/default --sizes 128,32,16 --repeats 1

The prefix cache keeps whole blocks only, so each request of an episode computes its context again
from the last full block on: half a block per request on average, on top of the new tokens (the
tool output and the template). On a CPU that prefill is the work that bounds an eval. This scores
RUN's warm start (checkpoint step 0) on RUN's held-out tasks as `carl train` does (its eval
limits, tools, sandbox, temperature, samples and concurrency, seeded sampling), once per block
size, the sizes interleaved over the repeats so that drift in the machine's speed hits them alike.

Reported per size: eval wall seconds (each repeat and the mean), the ratio of the mean to the first
size's, prompt tokens the engine computed (from its log: the prefix cache's hits are not
computed), generated tokens and pass@1. Seeded sampling gives every size the same random numbers,
so the samples should mostly agree; the JSON keeps every sample's outcome.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carl.config import load_config  # noqa: E402
from carl.engine.base import EngineError  # noqa: E402
from carl.engine.vllm_server import check_block_size  # noqa: E402
from carl.eval.bench import evaluate  # noqa: E402
from carl.harness.tools import default_tools  # noqa: E402
from carl.io import atomic_write_json  # noqa: E402
from carl.tasks import load_tasks  # noqa: E402
from carl.train.config import TrainConfig  # noqa: E402
from carl.train.loop import eval_limits, open_engine  # noqa: E402

THROUGHPUT = re.compile(r"Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s")
LOG_INTERVAL_S = 10.0  # vLLM's stat logger prints its averages every 10 s
START_MARK = "==== carl: starting vLLM (restart 0)"  # carl.engine.vllm_server.VLLMServer.start


def logged_tokens(log: Path) -> tuple[int, int]:
    """(prompt tokens computed, tokens generated) from a vLLM log's 10-second averages, since the
    last first start in it (carl appends to a log: an earlier run's lines come before)."""
    lines = log.read_text(errors="replace").splitlines()
    first_starts = [i for i, line in enumerate(lines) if line.startswith(START_MARK)]
    prompt = generated = 0.0
    for line in lines[first_starts[-1] if first_starts else 0:]:
        m = THROUGHPUT.search(line)
        if m:
            prompt += float(m.group(1)) * LOG_INTERVAL_S
            generated += float(m.group(2)) * LOG_INTERVAL_S
    return round(prompt), round(generated)


def eval_tasks_of(run: Path, cfg: TrainConfig) -> Path:
    if cfg.eval_tasks:
        return Path(cfg.eval_tasks)
    cut = run / "micro" / "eval.templates.jsonl"
    return cut if cut.exists() else run / "micro" / "eval.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a finished `carl train` run directory (config.toml, checkpoints/step_000000)")
    ap.add_argument("--sizes", default="128,32", help="comma-separated block sizes; ratios are to the first")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="JSON with every sample (default: RUN/kv_blocks.json)")
    args = ap.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        for size in sizes:  # before any eval runs, not when a refused size's turn comes
            check_block_size(size)
    except (ValueError, EngineError) as e:
        ap.error(f"--sizes {args.sizes!r}: {e}")
    model = args.run / "checkpoints" / "step_000000" / "model"
    if not (args.run / "config.toml").is_file() or not model.is_dir():
        sys.exit(f"{args.run}: expected a carl train run directory with config.toml and checkpoints/step_000000/model")
    cfg = load_config(TrainConfig, args.run / "config.toml")
    if cfg.engine.kind != "vllm":
        sys.exit(f"{args.run}: engine.kind is {cfg.engine.kind!r}; the block size is a vLLM setting")
    tasks = load_tasks(eval_tasks_of(args.run, cfg))
    tools = {name: tool for name, tool in default_tools().items() if name in cfg.tools}
    out = args.out or args.run / "kv_blocks.json"
    runs = []
    work = Path(out).with_suffix("")  # each engine's directory (its log)
    for rep in range(args.repeats):
        for size in sizes:
            c = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, block_size=size))
            engine_dir = work / f"r{rep}_bs{size}"
            engine, _ = open_engine(c, model, engine_dir, print)
            try:
                t0 = time.monotonic()
                with engine.sampling(c.eval.temperature):
                    report, rollouts = evaluate(f"block {size}", engine, tasks, c.eval.samples_per_task,
                                                eval_limits(c), tools, c.sandbox, max_workers=c.rollout.concurrency)
                wall = time.monotonic() - t0
            finally:
                engine.close()
            prompt, generated = logged_tokens(engine_dir / "engine" / "vllm.log")
            runs.append({"repeat": rep, "block_size": size, "wall_s": round(wall, 1), "pass@1": report.pass_at_1,
                         "prompt_tokens_computed": prompt, "generated_tokens": generated,
                         "samples": [{"task": r.task.instance_id, "passed": r.passed,
                                      "generated_tokens": r.trajectory.num_generated_tokens} for r in rollouts]})
            print(f"block {size}, repeat {rep + 1}/{args.repeats}: {wall:.1f} s, pass@1 {report.pass_at_1:.3f}, "
                  f"{prompt} prompt tokens computed", flush=True)
            atomic_write_json(out, {"run": str(args.run), "sizes": sizes, "runs": runs})
    base = statistics.mean(r["wall_s"] for r in runs if r["block_size"] == sizes[0])
    print(f"\n{'block':>5}  {'wall s (each)':<22}{'mean':>7}  {'vs ' + str(sizes[0]):>7}  {'prompt tok':>10}  pass@1")
    for size in sizes:
        mine = [r for r in runs if r["block_size"] == size]
        mean = statistics.mean(r["wall_s"] for r in mine)
        walls = ", ".join(str(r["wall_s"]) for r in mine)
        scores = ", ".join(f"{r['pass@1']:.3f}" for r in mine)
        prompt = round(statistics.mean(r["prompt_tokens_computed"] for r in mine))
        print(f"{size:>5}  {walls:<22}{mean:>7.1f}  {mean / base:>7.2f}  {prompt:>10}  {scores}")
    print(f"every sample: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
