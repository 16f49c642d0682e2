"""The rollout sampler under agent load: where a rollout phase's time goes, and against plain `generate`.

    .venv/bin/python benchmarks/sampler.py --quick                         # tiny random model, ~1 min on 2 cores
    .venv/bin/python benchmarks/sampler.py                                  # SmolLM2-135M, 16 episodes
    python benchmarks/sampler.py --device cuda --model random-smollm2 --episodes 64   # a GPU machine

N episode threads share one `HFEngine`, as RL and eval rollouts do. Each episode runs --turns
turns: it generates up to a random budget of tokens (uniform in --new-tokens LO HI; no stop ids),
then spends a "tool" gap, then appends --obs-len observation ids to its prompt. The gap is either
a sleep (--tool sleep, uniform in --gap LO HI seconds) or --tool process: that many fresh Python
processes run one after another (`python -c "import json"`), like the harness's test runs, which
start a pytest process per call. Reported:

  - wall time and generated tokens/s of the whole phase, the per-turn latency of `generate`
    (p50 / p90: what an episode waits for each assistant turn);
  - the sampler's own split (`HFEngine.take_stats`): busy fraction of the wall time, prefill,
    decode ms per step, mean rows per decode step, merges;
  - the baseline, measured in the same process on the same model: `model.generate` of --episodes
    prompts of the episodes' mean first-turn length, each making the episodes' mean tokens per
    turn, as one padded batch; the ratio is the phase's generated tokens/s over the baseline's.
    The baseline has no tools, no turns and no stragglers, so it bounds what batching could reach.

Run it with --prefix-cache 0 and 65536 to compare prefix reuse under load.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer import model_folder, save_random_llama, sync

from carl.engine.hf import HFEngine, HFEngineConfig, auto_dtype, pad_token_id


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help='"smollm2" (the cache), "random-smollm2", "tiny", or a folder')
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="auto: bf16 where the CPU or GPU computes it natively, else fp32 (carl.engine.hf.auto_dtype)")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=1024, help="first prompt (the system prompt and task)")
    p.add_argument("--obs-len", type=int, default=120, help="observation ids appended after each turn")
    p.add_argument("--new-tokens", type=int, nargs=2, default=[30, 120], metavar=("LO", "HI"))
    p.add_argument("--tool", choices=["sleep", "process"], default="sleep")
    p.add_argument("--gap", type=float, nargs=2, default=[0.5, 2.0], metavar=("LO", "HI"),
                   help="--tool sleep: seconds; --tool process: processes per tool call")
    p.add_argument("--prefix-cache", type=int, default=None, help="prefix_cache_tokens (default: the policy's auto)")
    p.add_argument("--attn", default="auto", help="attn_implementation of the sampler")
    p.add_argument("--heap-trim-s", type=float, default=HFEngineConfig.heap_trim_s,
                   help="heap_trim_s of the policy (0: never hand free heap pages back; see carl.systems.heap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny random model, 8 episodes x 3 turns")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args()
    if args.dtype == "auto":
        args.dtype = auto_dtype(args.device)
    if args.quick:
        args.model, args.episodes, args.turns, args.prompt_len = "tiny", 8, 3, 256
        args.new_tokens, args.obs_len, args.gap = [10, 40], 40, [0.1, 0.4]
    if args.new_tokens[0] < 1 or args.new_tokens[1] < args.new_tokens[0]:
        p.error(f"--new-tokens: got {args.new_tokens}, expected 1 <= LO <= HI")
    if args.gap[0] < 0 or args.gap[1] < args.gap[0]:
        p.error(f"--gap: got {args.gap}, expected 0 <= LO <= HI")

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_model(Path(tmp) / "tiny") if args.model == "tiny" else model_folder(args.model, Path(tmp))
        policy = HFEngine(HFEngineConfig(path=str(path), dtype=args.dtype, device=args.device, temperature=1.0,
                                         max_batch_size=args.episodes, seed=args.seed, attn_implementation=args.attn,
                                         prefix_cache_tokens=args.prefix_cache, heap_trim_s=args.heap_trim_s))
        print(f"{args.model} on {args.device} ({args.dtype}), {args.episodes} episodes x {args.turns} turns, "
              f"tools: {args.tool} {args.gap}, prefix cache {policy.prefix_cache.max_tokens} tokens, "
              f"heap trim every {args.heap_trim_s:g} s")
        out = agent_load(policy, args)
        out.update(rss_gb())  # the process's peak and current RSS after the agent load (the baseline adds its own)
        out.update({"heap_trims": policy.heap.trims, "heap_trim_time_s": policy.heap.trim_s})
        print(f"  RSS peak {out.get('rss_peak_gb', float('nan')):.2f} GB, now {out.get('rss_gb', float('nan')):.2f} GB; "
              f"{policy.heap.trims} heap trims took {policy.heap.trim_s:.2f} s")
        out.update(baseline(policy, args, out))
        policy.close()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


def agent_load(policy: HFEngine, args: argparse.Namespace) -> dict[str, float]:
    vocab = policy.model.config.vocab_size
    rng = random.Random(args.seed)
    first = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.episodes)]
    budgets = [[rng.randint(*args.new_tokens) for _ in range(args.turns)] for _ in range(args.episodes)]
    gaps = [[rng.uniform(*args.gap) for _ in range(args.turns)] for _ in range(args.episodes)]
    latencies: list[float] = []
    generated = [0] * args.episodes

    def tool(gap: float) -> None:
        if args.tool == "sleep":
            time.sleep(gap)
        else:
            for _ in range(round(gap)):
                subprocess.run([sys.executable, "-c", "import json"], check=True)

    def episode(i: int) -> None:
        prompt = list(first[i])
        for t in range(args.turns):
            t0 = time.perf_counter()
            gen = policy.generate(prompt, budgets[i][t], stop_ids=[])
            latencies.append(time.perf_counter() - t0)
            generated[i] += len(gen.token_ids)
            tool(gaps[i][t])
            prompt = prompt + gen.token_ids + [rng.randrange(3, vocab) for _ in range(args.obs_len)]

    policy.generate(first[0][:16], 2, stop_ids=[])  # warm-up (kernels, allocator)
    policy.take_stats()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=episode, args=(i,)) for i in range(args.episodes)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    stats = policy.take_stats()
    tokens = sum(generated)
    q = statistics.quantiles(latencies, n=10)
    out = {"wall_s": wall, "generated_tokens": tokens, "tokens_per_s": tokens / wall,
           "turn_latency_p50_s": statistics.median(latencies), "turn_latency_p90_s": q[-1],
           "prefills": stats.prefills, "decode_steps": stats.decode_steps, **stats.metrics(wall)}
    print(f"agent load: {wall:.1f} s, {tokens / wall:.0f} generated tok/s; turn latency p50 "
          f"{out['turn_latency_p50_s']:.2f} s, p90 {q[-1]:.2f} s")
    print(f"  sampler busy {100 * out['sampler/busy_frac']:.0f}% of the wall: prefill {stats.prefill_s:.1f} s "
          f"({stats.prefills} prompts, {out['sampler/prefill_tokens_per_s']:.0f} tok/s), decode {stats.decode_s:.1f} s "
          f"({stats.decode_steps} steps, {out['sampler/decode_ms_per_step']:.1f} ms each, "
          f"{out['sampler/rows_per_decode_step']:.1f} rows), merges {stats.merge_s:.1f} s")
    return out


def baseline(policy: HFEngine, args: argparse.Namespace, load: dict[str, float]) -> dict[str, float]:
    """model.generate of one padded batch of the episodes' first prompts, the mean tokens per turn each."""
    model, device = policy.model, args.device
    new = max(1, round(load["generated_tokens"] / (args.episodes * args.turns)))
    g = torch.Generator().manual_seed(args.seed + 1)
    ids_B_T = torch.randint(3, model.config.vocab_size, (args.episodes, args.prompt_len), generator=g).to(device)
    pad_id = pad_token_id(policy.tokenizer)

    def run() -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids=ids_B_T, attention_mask=torch.ones_like(ids_B_T), do_sample=True, temperature=1.0,
                           top_k=0, max_new_tokens=new, min_new_tokens=new, pad_token_id=pad_id)
        sync(device)
        return time.perf_counter() - t0

    run()  # warm-up
    t = statistics.median(run() for _ in range(2))
    tps = args.episodes * new / t
    print(f"baseline model.generate: {args.episodes} x {new} tokens after {args.prompt_len}-token prompts in "
          f"{t:.2f} s, {tps:.0f} tok/s; agent load / baseline = {load['tokens_per_s'] / tps:.2f}")
    return {"baseline_tokens_per_s": tps, "ratio_load_over_baseline": load["tokens_per_s"] / tps}


def rss_gb() -> dict[str, float]:
    """Peak (VmHWM) and current (VmRSS) resident memory of this process in GB (Linux /proc; empty elsewhere)."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        return {}
    kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("VmHWM", "VmRSS")}
    return {"rss_peak_gb": kb["VmHWM"] / 1e6, "rss_gb": kb["VmRSS"] / 1e6}


def tiny_model(folder: Path) -> Path:
    """A 2-layer Llama with SmolLM2's vocabulary size and random weights (seconds to build, for --quick)."""
    from transformers import LlamaConfig

    return save_random_llama(folder, LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=2))

if __name__ == "__main__":
    main()
