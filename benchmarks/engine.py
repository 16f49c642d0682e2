"""The engines under agent load: HFEngine vs VLLMEngine vs bare vLLM on the same prompts, in one run.

    .venv/bin/python benchmarks/engine.py --quick            # tiny random model, ~3 min on 2 cores
    .venv/bin/python benchmarks/engine.py                    # SmolLM2-135M, 16 episodes x 5 turns
    .venv/bin/python benchmarks/engine.py --engines vllm     # one engine only
    .venv/bin/python benchmarks/engine.py --engines vllm,vllm-compiled  # eager vs compiled vLLM

Agent load (as benchmarks/sampler.py): N episode threads share one engine. Each episode runs
--turns turns: it generates up to a random budget of tokens (no stop ids), waits a "tool" gap
(a sleep, uniform in --gap), then appends --obs-len observation ids to its prompt, so contexts
grow turn by turn and later turns share a prefix with earlier ones. The first prompts are
--prompt-len random ids. Every engine gets the same episodes (the same seeds for budgets, gaps
and observations; sampled ids differ by engine, so later prompts differ too).

Reported per engine: generated tokens/s of the whole phase, turn latency p50/p90 (what an
episode waits for one assistant turn), the engine's busy fraction (time with a request in
flight, `carl.engine.base.EngineStats`), and for the vLLM engine its start-up time. Then the
baseline: bare vLLM, i.e. vLLM's own offline `LLM.generate` in vLLM's environment on exactly
the requests the vLLM engine served (prompt ids and sampled lengths), one batch per turn index
with no tool gaps and no HTTP: an upper bound on what the engine path could reach. Ratios:
vllm / hf and vllm / bare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sampler import rss_gb  # noqa: E402
from trainer import model_folder, save_random_llama  # noqa: E402

from carl.engine.base import SamplingParams  # noqa: E402
from carl.engine.config import EngineConfig  # noqa: E402
from carl.engine.hf import HFEngine, HFEngineConfig, auto_dtype  # noqa: E402

BARE = r"""
import json, sys, time
from vllm import LLM, SamplingParams, TokensPrompt


def main():
  spec = json.load(open(sys.argv[1]))
  llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"], enforce_eager=True,
            enable_chunked_prefill=False, max_num_batched_tokens=spec["max_model_len"], seed=0)
  turns = spec["turns"]  # [[(prompt ids, n tokens), ...] per turn index]
  llm.generate([TokensPrompt(prompt_token_ids=turns[0][0][0][:16])], SamplingParams(max_tokens=2))  # warm-up
  t0, tokens = time.perf_counter(), 0
  for reqs in turns:
      params = [SamplingParams(max_tokens=n, min_tokens=n, temperature=1.0, seed=i) for i, (_, n) in enumerate(reqs)]
      outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in reqs], params, use_tqdm=False)
      tokens += sum(len(o.outputs[0].token_ids) for o in outs)
  wall = time.perf_counter() - t0
  print(json.dumps({"wall_s": wall, "generated_tokens": tokens, "tokens_per_s": tokens / wall}))


if __name__ == "__main__":  # vLLM's engine process is spawned: it re-imports this file
  main()
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help='"smollm2", "random-smollm2", "tiny", or a folder')
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="auto: bf16 where the CPU or GPU computes it natively, else fp32 (carl.engine.hf.auto_dtype)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=1500, help="first prompt (system prompt and task)")
    p.add_argument("--obs-len", type=int, default=120, help="observation ids appended after each turn")
    p.add_argument("--new-tokens", type=int, nargs=2, default=[30, 120], metavar=("LO", "HI"))
    p.add_argument("--gap", type=float, nargs=2, default=[0.5, 2.0], metavar=("LO", "HI"), help="tool seconds")
    p.add_argument("--engines", default="hf,vllm",
                   help="comma-separated: hf, vllm, vllm-compiled (engine.enforce_eager=false)")
    p.add_argument("--no-bare", action="store_true", help="skip the bare vLLM baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny random model, 8 episodes x 3 turns")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args()
    if args.dtype == "auto":
        args.dtype = auto_dtype("cpu")
    if args.quick:
        args.model, args.episodes, args.turns, args.prompt_len = "tiny", 8, 3, 256
        args.new_tokens, args.obs_len, args.gap = [10, 40], 40, [0.1, 0.4]
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - {"hf", "vllm", "vllm-compiled"}:
        p.error(f"--engines: got {args.engines!r}, expected a comma-separated subset of hf,vllm,vllm-compiled")
    if args.new_tokens[0] < 1 or args.new_tokens[1] < args.new_tokens[0]:
        p.error(f"--new-tokens: got {args.new_tokens}, expected 1 <= LO <= HI")

    out: dict = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp) / "tiny") if args.model == "tiny" else model_folder(args.model, Path(tmp))
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        max_len = args.prompt_len + args.turns * (args.new_tokens[1] + args.obs_len) + 16
        print(f"{args.model} ({args.dtype}), {args.episodes} episodes x {args.turns} turns, first prompts "
              f"{args.prompt_len} ids, tools {args.gap} s; context up to {max_len}")
        for name in engines:
            t0 = time.perf_counter()
            if name == "hf":
                engine = HFEngine(HFEngineConfig(path=str(path), dtype=args.dtype, temperature=1.0,
                                                 max_batch_size=args.episodes, seed=args.seed))
            else:
                from carl.engine.vllm import VLLMEngine

                config = EngineConfig(enforce_eager=name == "vllm")
                engine = VLLMEngine(path, Path(tmp) / f"weights-{name}", config, Path(tmp) / f"engine-{name}",
                                    max_model_len=max_len, seed=args.seed, sampling=SamplingParams(1.0),
                                    dtype=args.dtype)
            start_s = time.perf_counter() - t0
            result, requests = agent_load(engine, vocab, args)
            result["start_s"] = start_s
            engine.close()
            out[name] = result
            print(f"{name}: {result['tokens_per_s']:.1f} generated tok/s, turn latency p50 "
                  f"{result['turn_latency_p50_s']:.2f} s (start {start_s:.0f} s)", flush=True)
            if name == "vllm":
                out["vllm_requests"] = requests
        if "vllm" in engines and not args.no_bare:
            out["bare_vllm"] = bare_vllm(path, args, out.pop("vllm_requests"), max_len, Path(tmp))
        out.pop("vllm_requests", None)
    report(out, engines)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def agent_load(engine, vocab: int, args: argparse.Namespace) -> tuple[dict, list[list[tuple[list[int], int]]]]:
    rng = random.Random(args.seed)
    first = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.episodes)]
    budgets = [[rng.randint(*args.new_tokens) for _ in range(args.turns)] for _ in range(args.episodes)]
    gaps = [[rng.uniform(*args.gap) for _ in range(args.turns)] for _ in range(args.episodes)]
    obs = [[[rng.randrange(3, vocab) for _ in range(args.obs_len)] for _ in range(args.turns)]
           for _ in range(args.episodes)]
    latencies: list[float] = []
    generated = [0] * args.episodes
    requests: list[list[tuple[list[int], int]]] = [[None] * args.episodes for _ in range(args.turns)]

    def episode(i: int) -> None:
        prompt = list(first[i])
        for t in range(args.turns):
            t0 = time.perf_counter()
            gen = engine.generate(prompt, budgets[i][t], [], seed=args.seed * 1000 + i * 10 + t)
            latencies.append(time.perf_counter() - t0)
            generated[i] += len(gen.token_ids)
            requests[t][i] = (list(prompt), len(gen.token_ids))
            time.sleep(gaps[i][t])
            prompt = prompt + gen.token_ids + obs[i][t]

    engine.generate(first[0][:16], 2, [])  # warm-up
    engine.take_metrics()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=episode, args=(i,)) for i in range(args.episodes)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    m = engine.take_metrics()
    tokens = sum(generated)
    q = statistics.quantiles(latencies, n=10)
    result = {"wall_s": wall, "generated_tokens": tokens, "tokens_per_s": tokens / wall,
              "turn_latency_p50_s": statistics.median(latencies), "turn_latency_p90_s": q[-1],
              "busy_frac": m["engine/busy_frac"], **rss_gb()}
    return result, requests


def bare_vllm(path: Path, args, requests, max_len: int, tmp: Path) -> dict:
    from carl.engine.vllm_env import vllm_python

    spec, script = tmp / "bare.json", tmp / "bare_vllm.py"
    spec.write_text(json.dumps({"model": str(path), "dtype": args.dtype, "max_model_len": max_len, "turns": requests}))
    script.write_text(BARE)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(EngineConfig().kv_cache_gb)}
    res = subprocess.run([str(vllm_python()), str(script), str(spec)], capture_output=True, text=True, timeout=3600,
                         env=env)
    if res.returncode != 0:
        errors = [line for line in res.stderr.splitlines() if "Error" in line]
        return {"error": (errors or res.stderr.splitlines() or ["no output"])[-1]}
    return json.loads(next(line for line in res.stdout.splitlines() if line.startswith('{"wall_s"')))


def tiny_model(folder: Path) -> Path:
    """A 2-layer Llama with SmolLM2's vocabulary and random weights; head size 64 (vLLM's CPU kernels)."""
    from transformers import LlamaConfig

    return save_random_llama(folder, LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=2))


def report(out: dict, engines: list[str]) -> None:
    print(f"\n{'engine':<14} {'tok/s':>8} {'wall s':>8} {'p50 s':>7} {'p90 s':>7} {'busy':>6} {'start s':>8}")
    for name in engines:
        r = out[name]
        print(f"{name:<14} {r['tokens_per_s']:>8.1f} {r['wall_s']:>8.1f} {r['turn_latency_p50_s']:>7.2f} "
              f"{r['turn_latency_p90_s']:>7.2f} {r['busy_frac']:>6.0%} {r['start_s']:>8.1f}")
    if "error" in out.get("bare_vllm", {}):
        print(f"bare vllm failed: {out.pop('bare_vllm')['error']}")
    if "bare_vllm" in out:
        b = out["bare_vllm"]
        print(f"{'bare vllm':<14} {b['tokens_per_s']:>8.1f} {b['wall_s']:>8.1f}   (turn-synchronous batches, "
              "no tool gaps, no HTTP)")
    if {"hf", "vllm"} <= set(engines):
        out["ratio_vllm_over_hf"] = out["vllm"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
        print(f"vllm / hf tokens/s = {out['ratio_vllm_over_hf']:.2f}")
    if {"vllm", "vllm-compiled"} <= set(engines):
        out["ratio_compiled_over_eager"] = out["vllm-compiled"]["tokens_per_s"] / out["vllm"]["tokens_per_s"]
        print(f"vllm-compiled / vllm (eager) tokens/s = {out['ratio_compiled_over_eager']:.2f}")
    if "bare_vllm" in out:
        out["ratio_vllm_over_bare"] = out["vllm"]["tokens_per_s"] / out["bare_vllm"]["tokens_per_s"]
        print(f"vllm / bare vllm tokens/s = {out['ratio_vllm_over_bare']:.2f}")


if __name__ == "__main__":
    main()
