"""Trainer throughput: the RL train step and rollout generation against plain transformers, same run.

    .venv/bin/python benchmarks/trainer.py                      # SmolLM2-135M, CPU, 8 x 1024 tokens (~7 min on 2 cores)
    .venv/bin/python benchmarks/trainer.py --quick --batch 2 --seq-len 512 --new-tokens 32   # ~1 min
    python benchmarks/trainer.py --device cuda --model random-smollm2   # a GPU machine without the cache

    (a)  carl.train.step.rl_step (Dr. GRPO, fp32 master weights, autocast compute dtype, AdamW) on
         B synthetic rollouts of T tokens: a prompt, then turns of sampled tokens and observations,
         `--gen-frac` of the tokens sampled (loss only there)
    (a') plain transformers: model(input_ids, attention_mask, labels) -> loss.backward() on the same
         padded micro-batches, gradient clipping, the same AdamW step
    (b)  carl.engine.hf.HFEngine.generate: B concurrent requests (threads, batched together by the
         policy), N new tokens each, sampled at temperature 1 with log-probs
    (b') model.generate of the same B prompts on the same model object (do_sample, top_k off,
         min_new_tokens = N so every row makes exactly N tokens)

    (c)  multi-turn episodes: B concurrent threads, each --turns turns; turn t's prompt is turn
         t-1's prompt + its sampled ids + --obs-len observation ids (as the harness builds it),
         HFEngine with prefix reuse (`prefix_cache_tokens=65536`) against the same policy with
         reuse off (`prefix_cache_tokens=0`), same prompts, same seeds
    (d)  rl_step with the KL penalty (rl.kl_coef = 1) and the top --trainable-layers blocks
         trained, the reference sharing the policy's frozen trunk (carl.train.reference)
         against the full start model as reference (and, for scale, the same step without KL)
    (e)  warm-start epochs (carl.train.warm_start.sft_epoch) with the top --trainable-layers blocks
         trained: after a first epoch that keeps the frozen trunk's output (TrunkCache), an epoch on
         the kept states against an epoch that reruns the whole model (the first epoch's cost, as
         every epoch had before the cache), from the same weights on the same sequences
    (f)  rl_step with the top --trainable-layers blocks trained on B rollouts whose first
         --shared-prompt tokens are the same (the system prompt and tool list every episode starts
         with), that prompt run once per micro-batch (rl.share_prefix, carl.train.prefix) against
         once per sequence, from the same weights on the same rollouts; then warm-start epochs on
         the same sequences (batches of 4), shared against not: full passes (the first epoch's),
         and top-block passes on the trunk cache's kept states (the later epochs')
    (g)  the output head at the (row, position) pairs a micro-batch scores (carl.rl.logprobs.scored_head)
         against the head at every position some row of it scores (`logits_to_keep`, the code before
         2026-12-07, kept below as the baseline), on rollouts whose turns start at different offsets
         in different rows (as real episodes' do): warm-start epochs on the trunk cache's kept states,
         and rl_step, from the same weights on the same rollouts (no shared prompt in either arm)

    (h)  the first warm-start epoch from an empty trunk cache, on rollouts that start with the same
         --shared-prompt tokens (turns staggered as in (g)): the trunk's states kept before it
         (`TrunkCache.fill`: the prompt through the trunk once, then every rest; all micro-batches but
         the first then run the top blocks only) against keeping them during its full passes (the
         code before 2026-12-07: the prompt through the trunk once per micro-batch)

Tokens per second are over all tokens of the batch for (a)/(a') and over generated tokens for
(b)/(b'); each number is the median of --iters timed runs (carl and plain alternating) after one
warm-up each, and the ratios
(carl / plain) are what to compare across machines. Self-distillation is off here (synthetic
rollouts have no error turns): its teacher pass costs one extra no-grad forward of the error turns.

`--model random-smollm2` builds SmolLM2-135M's architecture (30 layers, hidden 576, GQA 9/3 heads,
vocab 49152, tied embeddings) with random weights: the same speed, for machines without the
converted SmolLM2 cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carl.engine.hf import DTYPES, HFEngine, HFEngineConfig, auto_dtype, load_model, pad_token_id
from carl.tasks import TaskRecord
from carl.train.config import RLConfig
from carl.train.loop import set_trainable
from carl.train.reference import FullReference, SharedTrunkReference, load_reference
from carl.rollout.rollout import Rollout
from carl.train.step import micro_batches, rl_step
from carl.types import Segment, Trajectory

TASK = TaskRecord(instance_id="bench__0", repo="bench")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", help='"smollm2" (cached), "random-smollm2", or a HF folder')
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=8, help="sequences per train step / concurrent requests")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per training sequence")
    p.add_argument("--gen-frac", type=float, default=0.25, help="fraction of training tokens that were sampled")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens per generation request")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--micro-batch-tokens", type=int, default=4096, help="rl.micro_batch_tokens")
    p.add_argument("--dtype", default="auto", choices=["auto", *sorted(DTYPES)],
                   help="compute dtype of the train step (autocast) and weights of the sampler; auto: bf16 where "
                        "the device computes it natively, else fp32 (carl.engine.hf.auto_dtype)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one timed run each")
    p.add_argument("--skip", default="", help="comma list of parts to skip: train,generate,multiturn,kl,warmstart,prefix,prefix-warmstart,head,fill")
    p.add_argument("--trainable-layers", type=int, default=6, help="(d) model.trainable_layers")
    p.add_argument("--turns", type=int, default=4, help="(c) turns per episode")
    p.add_argument("--obs-len", type=int, default=96, help="(c) observation tokens appended after each turn")
    p.add_argument("--shared-prompt", type=int, default=1150,
                   help="(f) tokens every rollout starts with (the micro world's system + task prompt: about 1,150)")
    p.add_argument("--len-jitter", type=float, default=0.0,
                   help="(f, h) each rollout cut to a random length in [seq-len x (1 - this), seq-len] (0: all seq-len)")
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args()
    if args.dtype == "auto":
        args.dtype = auto_dtype(args.device)
    iters = 1 if args.quick else args.iters
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        path = model_folder(args.model, Path(tmp))
        results: dict[str, float | str] = {"model": args.model, "device": args.device, "dtype": args.dtype,
                                           "torch_threads": torch.get_num_threads()}
        if "train" not in args.skip:
            results.update(bench_train(path, args, iters))
        if "generate" not in args.skip:
            results.update(bench_generate(path, args, iters))
        if "multiturn" not in args.skip:
            results.update(bench_multiturn(path, args, iters))
        if "kl" not in args.skip:
            results.update(bench_kl(path, args, iters))
        if "warmstart" not in args.skip:
            results.update(bench_warm_start(path, args, iters))
        if "prefix" not in args.skip:
            results.update(bench_shared_prompt(path, args, iters))
        if "head" not in args.skip:
            results.update(bench_scored_head(path, args, iters))
        if "fill" not in args.skip:
            results.update(bench_trunk_fill(path, args, iters))
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


# ---------------------------------------------------------------- (a) train step vs forward/backward


def bench_train(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    tokenizer, model = load_model(path, torch.float32, args.device)  # fp32 master weights, as in carl train
    params = set_trainable(model, 0)
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    pad_id = pad_token_id(tokenizer)
    compute_dtype = DTYPES[args.dtype]
    cfg = RLConfig(sd_weight=0.0, micro_batch_tokens=args.micro_batch_tokens)
    groups = synthetic_groups(args.batch, args.seq_len, args.gen_frac, model.config.vocab_size)
    num_tokens = args.batch * args.seq_len
    num_generated = sum(r.trajectory.num_generated_tokens for g in groups for r in g)

    def carl_step() -> None:
        rl_step(model, optimizer, None, groups, cfg, tokenizer, pad_id, token_normalizer=float(num_generated),
                compute_dtype=compute_dtype)

    rows = [s.token_ids_T for g in groups for r in g for s in r.trajectory.segments]
    per_micro = max(1, len(micro_batches_of(rows, args.micro_batch_tokens)[0]))

    def plain_step() -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(rows), per_micro):
            ids_B_T = torch.tensor(rows[start : start + per_micro], device=args.device)
            with torch.autocast(ids_B_T.device.type, dtype=compute_dtype, enabled=compute_dtype != torch.float32):
                loss = model(input_ids=ids_B_T, attention_mask=torch.ones_like(ids_B_T), labels=ids_B_T).loss
            (loss * ids_B_T.shape[0] / len(rows)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    t_carl, t_plain = timed_pair(carl_step, plain_step, iters, args.device)
    out = {
        "train_tokens": num_tokens,
        "train_generated_tokens": num_generated,
        "train_rows_per_micro_batch": per_micro,
        "train_step_s": t_carl,
        "train_plain_fwd_bwd_s": t_plain,
        "train_tokens_per_s": num_tokens / t_carl,
        "train_plain_tokens_per_s": num_tokens / t_plain,
        "train_ratio_carl_over_plain": t_plain / t_carl,
    }
    print(f"(a)  rl_step           {out['train_tokens_per_s']:9.0f} tok/s ({t_carl:.2f} s for {num_tokens} tokens)")
    print(f"(a') plain fwd+bwd     {out['train_plain_tokens_per_s']:9.0f} tok/s ({t_plain:.2f} s)   "
          f"ratio {out['train_ratio_carl_over_plain']:.2f}")
    return out


def synthetic_groups(batch: int, seq_len: int, gen_frac: float, vocab: int, group_size: int = 4,
                     stagger: int = 0) -> list[list[Rollout]]:
    """`batch` rollouts in groups of `group_size`: a prompt (1/4 of the tokens), then turns of 128
    tokens whose first part was sampled, so that `gen_frac` of all tokens were sampled; with
    `stagger`, rollout b's turns start b x stagger tokens later (mod 128) than rollout 0's."""
    prompt = seq_len // 4
    gen_per_turn = max(1, round(128 * gen_frac * seq_len / (seq_len - prompt)))
    g = torch.Generator().manual_seed(0)
    groups: list[list[Rollout]] = []
    for b in range(batch):
        ids = torch.randint(3, vocab, (seq_len,), generator=g).tolist()
        mask = [prompt <= t and (t - prompt - b * stagger) % 128 < gen_per_turn for t in range(seq_len)]
        seg = Segment(token_ids_T=ids, generated_mask_T=mask, logprobs_T=[-2.0 if m else 0.0 for m in mask])
        rollout = Rollout(TASK, Trajectory(task_id=TASK.instance_id, segments=[seg]), reward=float(b % 2),
                          passed=b % 2 == 1)
        if b % group_size == 0:
            groups.append([])
        groups[-1].append(rollout)
    return groups


def micro_batches_of(rows: list[list[int]], max_tokens: int) -> list[list]:
    """The micro-batches rl_step makes of these rows (the plain baseline uses the same split)."""
    from carl.train.step import TrainSequence

    return micro_batches([TrainSequence(r, [True] * len(r), [0.0] * len(r), 0.0) for r in rows], max_tokens)


# ---------------------------------------------------------------- (b) HFEngine.generate vs model.generate


def bench_generate(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    policy = HFEngine(HFEngineConfig(path=str(path), dtype=args.dtype, device=args.device, temperature=1.0,
                                     max_batch_size=args.batch, batch_wait_s=0.05))
    vocab = policy.model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)]
    new = args.new_tokens
    counts: list[int] = []

    def carl_generate() -> None:
        gens: list = [None] * len(prompts)

        def one(i: int) -> None:
            gens[i] = policy.generate(prompts[i], new, stop_ids=[])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts.append(sum(len(x.token_ids) for x in gens))

    model = policy.model
    pad_id = pad_token_id(policy.tokenizer)

    def plain_generate() -> None:
        ids_B_T = torch.tensor(prompts, device=args.device)
        with torch.no_grad():
            out = model.generate(input_ids=ids_B_T, attention_mask=torch.ones_like(ids_B_T), do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=pad_id)
        counts.append(int(out.shape[0] * (out.shape[1] - ids_B_T.shape[1])))

    t_carl, t_plain = timed_pair(carl_generate, plain_generate, iters, args.device)
    live_rows = policy.max_live_rows  # the most requests the policy decoded together
    policy.close()
    tokens = args.batch * new
    if any(c != tokens for c in counts):
        raise RuntimeError(f"expected {tokens} generated tokens per run, got {counts}")
    out = {
        "generate_tokens": tokens,
        "generate_max_rows_decoded_together": live_rows,
        "generate_s": t_carl,
        "generate_plain_s": t_plain,
        "generate_tokens_per_s": tokens / t_carl,
        "generate_plain_tokens_per_s": tokens / t_plain,
        "generate_ratio_carl_over_plain": t_plain / t_carl,
    }
    print(f"(b)  HFEngine.generate {out['generate_tokens_per_s']:9.1f} tok/s ({t_carl:.2f} s for {tokens} tokens, "
          f"up to {live_rows} rows decoded together)")
    print(f"(b') model.generate    {out['generate_plain_tokens_per_s']:9.1f} tok/s ({t_plain:.2f} s)   "
          f"ratio {out['generate_ratio_carl_over_plain']:.2f}")
    return out


# ---------------------------------------------------------------- (c) multi-turn: prefix reuse on vs off


def bench_multiturn(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    policies = {name: HFEngine(HFEngineConfig(path=str(path), dtype=args.dtype, device=args.device, temperature=1.0,
                                              max_batch_size=args.batch, batch_wait_s=0.05, seed=3, **kw))
                for name, kw in (("reuse", {"prefix_cache_tokens": 65536}), ("full", {"prefix_cache_tokens": 0}))}
    vocab = policies["reuse"].model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    first = [torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.batch)]
    obs = [[torch.randint(3, vocab, (args.obs_len,), generator=g).tolist() for _ in range(args.turns)]
           for _ in range(args.batch)]
    generated: dict[str, list[int]] = {"reuse": [], "full": []}

    def episodes(name: str):
        policy = policies[name]
        policy.prefix_cache.clear()  # every run starts cold, like a new step's rollouts

        def run():
            totals = [0] * args.batch

            def one(i: int) -> None:
                prompt = list(first[i])
                for t in range(args.turns):
                    gen = policy.generate(prompt, args.new_tokens, stop_ids=[])
                    totals[i] += len(gen.token_ids)
                    prompt = prompt + gen.token_ids + obs[i][t]

            threads = [threading.Thread(target=one, args=(i,)) for i in range(args.batch)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            generated[name].append(sum(totals))
        return run

    t_reuse, t_full = timed_pair(episodes("reuse"), episodes("full"), iters, args.device)
    cache = policies["reuse"].prefix_cache
    reused_frac = cache.reused_tokens / max(cache.reused_tokens + cache.prefilled_tokens, 1)
    for policy in policies.values():
        policy.close()
    tokens = args.batch * args.turns * args.new_tokens
    if any(c != tokens for counts in generated.values() for c in counts):
        raise RuntimeError(f"expected {tokens} generated tokens per run, got {generated}")
    out = {
        "multiturn_generated_tokens": tokens,
        "multiturn_reuse_s": t_reuse,
        "multiturn_full_prefill_s": t_full,
        "multiturn_prompt_tokens_reused_frac": reused_frac,
        "multiturn_ratio_reuse_over_full": t_full / t_reuse,
    }
    print(f"(c)  {args.batch} episodes x {args.turns} turns, prefix reuse {tokens / t_reuse:9.1f} tok/s "
          f"({t_reuse:.2f} s; {100 * reused_frac:.0f}% of prompt tokens reused)")
    print(f"(c') same, full prefill each turn {tokens / t_full:9.1f} tok/s ({t_full:.2f} s)   "
          f"ratio {out['multiturn_ratio_reuse_over_full']:.2f}")
    return out


# ---------------------------------------------------------------- (d) KL reference: shared trunk vs full


def bench_kl(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    tokenizer, model, optimizer, pad_id, compute_dtype = top_trained(path, args)
    cfg = RLConfig(sd_weight=0.0, kl_coef=1.0, micro_batch_tokens=args.micro_batch_tokens)
    groups = synthetic_groups(args.batch, args.seq_len, args.gen_frac, model.config.vocab_size)
    shared = load_reference(path, model, args.trainable_layers, args.device)
    if not isinstance(shared, SharedTrunkReference):
        raise SystemExit(f"(d) the reference did not split at --trainable-layers {args.trainable_layers}")
    full = FullReference(load_model(path, torch.float32, args.device)[1])

    def step(reference, kl_coef=1.0):
        return lambda: rl_step(model, optimizer, None, groups, replace(cfg, kl_coef=kl_coef), tokenizer, pad_id,
                               token_normalizer=float(args.batch * args.seq_len), compute_dtype=compute_dtype,
                               reference=reference)

    t_shared, t_full = timed_pair(step(shared), step(full), iters, args.device)
    t_none, _ = timed_pair(step(None, kl_coef=0.0), lambda: None, iters, args.device)
    out = {"kl_step_shared_trunk_s": t_shared, "kl_step_full_reference_s": t_full, "kl_step_without_kl_s": t_none,
           "kl_ratio_full_over_shared": t_full / t_shared}
    print(f"(d)  rl_step + KL, shared trunk {t_shared:.2f} s, full reference {t_full:.2f} s "
          f"(ratio {t_full / t_shared:.2f}); without KL {t_none:.2f} s "
          f"({args.trainable_layers} of {model.config.num_hidden_layers} blocks trained)")
    return out


def bench_warm_start(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    import random

    from carl.train.warm_start import TrunkCache, sft_epoch

    tokenizer, model, optimizer, pad_id, compute_dtype = top_trained(path, args)
    data = [r for g in synthetic_groups(args.batch, args.seq_len, args.gen_frac, model.config.vocab_size) for r in g]
    data = [replace(r, passed=True, reward=1.0) for r in data]  # warm-start data: solved episodes
    trunk = TrunkCache(model, args.trainable_layers)

    def epoch(cache):
        return lambda: sft_epoch(model, optimizer, data, pad_id, batch_size=4, micro_batch_tokens=args.micro_batch_tokens,
                                 grad_clip=1.0, rng=random.Random(0), compute_dtype=compute_dtype, trunk=cache)

    t0 = time.perf_counter()
    epoch(trunk)()  # the first epoch: a full pass that keeps the trunk's states
    t_first = time.perf_counter() - t0
    if not trunk.enabled:
        raise SystemExit(f"(e) the trunk cache turned itself off at --trainable-layers {args.trainable_layers}")
    t_cached, t_full = timed_pair(epoch(trunk), epoch(None), iters, args.device)
    out = {"warm_start_first_epoch_s": t_first, "warm_start_epoch_cached_s": t_cached,
           "warm_start_epoch_full_s": t_full, "warm_start_ratio_full_over_cached": t_full / t_cached,
           "warm_start_trunk_cache_mb": trunk.bytes / 1e6}
    print(f"(e)  warm-start epoch on the kept trunk states {t_cached:.2f} s, full {t_full:.2f} s "
          f"(ratio {t_full / t_cached:.2f}; first epoch {t_first:.2f} s, {trunk.bytes / 1e6:.1f} MB kept)")
    return out


def prompted_groups(args: argparse.Namespace, vocab: int, **kwargs) -> list[list]:
    """`synthetic_groups` whose rollouts all start with the same --shared-prompt tokens, unscored."""
    if not 0 < args.shared_prompt < args.seq_len:
        raise SystemExit(f"--shared-prompt {args.shared_prompt}: expected between 0 and --seq-len {args.seq_len}")
    prompt = torch.randint(3, vocab, (args.shared_prompt,), generator=torch.Generator().manual_seed(1))
    groups = synthetic_groups(args.batch, args.seq_len, args.gen_frac, vocab, **kwargs)
    rng = torch.Generator().manual_seed(2)
    for r in (r for g in groups for r in g):
        seg = r.trajectory.segments[0]
        seg.token_ids_T[: args.shared_prompt] = prompt.tolist()
        seg.generated_mask_T[: args.shared_prompt] = [False] * args.shared_prompt
        seg.logprobs_T[: args.shared_prompt] = [0.0] * args.shared_prompt
        if args.len_jitter:  # a shorter episode: cut at a length in [seq_len x (1 - jitter), seq_len]
            T = int(args.seq_len * (1 - args.len_jitter * float(torch.rand((), generator=rng))))
            T = max(T, next(t for t, m in enumerate(seg.generated_mask_T) if m) + 1)  # keep a scored token
            seg.token_ids_T, seg.generated_mask_T, seg.logprobs_T = (x[:T] for x in (seg.token_ids_T, seg.generated_mask_T,
                                                                                    seg.logprobs_T))
    return groups


def bench_shared_prompt(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    tokenizer, model, optimizer, pad_id, compute_dtype = top_trained(path, args)
    groups = prompted_groups(args, model.config.vocab_size)
    cfg = RLConfig(sd_weight=0.0, micro_batch_tokens=args.micro_batch_tokens)
    stats = {}

    def step(share: bool):
        def run() -> None:
            stats[share] = rl_step(model, optimizer, None, groups, replace(cfg, share_prefix=share), tokenizer, pad_id,
                                   token_normalizer=float(args.batch * args.seq_len), compute_dtype=compute_dtype)
        return run

    t_shared, t_full = timed_pair(step(True), step(False), iters, args.device)
    if not stats[True]["rl/prefix_tokens_shared"]:
        raise SystemExit("(f) no prompt was shared (the check against the full pass failed?)")
    out = {"prefix_step_shared_s": t_shared, "prefix_step_full_s": t_full, "prefix_ratio_full_over_shared": t_full / t_shared,
           "prefix_tokens_shared": stats[True]["rl/prefix_tokens_shared"]}
    print(f"(f)  rl_step, {args.shared_prompt}-token prompt run once per micro-batch {t_shared:.2f} s, once per "
          f"sequence {t_full:.2f} s (ratio {t_full / t_shared:.2f}; {out['prefix_tokens_shared']:.0f} of "
          f"{args.batch * args.seq_len} tokens not rerun)")
    if "prefix-warmstart" not in args.skip:
        out.update(bench_shared_prompt_warm_start(model, optimizer, pad_id, compute_dtype, groups, args, iters))
    return out


def bench_shared_prompt_warm_start(model, optimizer, pad_id, compute_dtype, groups, args, iters) -> dict[str, float]:
    import random

    from carl.train.warm_start import TrunkCache, sft_epoch

    data = [replace(r, passed=True, reward=1.0) for g in groups for r in g]  # warm-start data: solved episodes
    trunk = TrunkCache(model, args.trainable_layers)

    def epoch(share: bool, cache):
        return lambda: sft_epoch(model, optimizer, data, pad_id, batch_size=4, micro_batch_tokens=args.micro_batch_tokens,
                                 grad_clip=1.0, rng=random.Random(0), compute_dtype=compute_dtype, trunk=cache,
                                 share_prefix=share)

    t_first, t_first_full = timed_pair(epoch(True, None), epoch(False, None), iters, args.device)
    epoch(True, trunk)()  # keeps the trunk's states (and checks the shared top-block pass)
    if not (trunk.enabled and trunk.share_ok):
        raise SystemExit(f"(f) trunk cache enabled={trunk.enabled}, shared top-block passes ok={trunk.share_ok}")
    t_top, t_top_full = timed_pair(epoch(True, trunk), epoch(False, trunk), iters, args.device)
    out = {"prefix_sft_epoch_shared_s": t_first, "prefix_sft_epoch_full_s": t_first_full,
           "prefix_sft_ratio_full_over_shared": t_first_full / t_first,
           "prefix_sft_cached_epoch_shared_s": t_top, "prefix_sft_cached_epoch_full_s": t_top_full,
           "prefix_sft_cached_ratio_full_over_shared": t_top_full / t_top}
    print(f"(f') warm-start epoch, prompt shared {t_first:.2f} s vs not {t_first_full:.2f} s "
          f"(ratio {t_first_full / t_first:.2f}); on the kept trunk states {t_top:.2f} s vs {t_top_full:.2f} s "
          f"(ratio {t_top_full / t_top:.2f})")
    return out


# ---------------------------------------------------------------- (h) the trunk's states kept before the warm start


def bench_trunk_fill(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    import random

    from carl.train.warm_start import TrunkCache, sft_epoch, sft_sequences

    tokenizer, model, optimizer, pad_id, compute_dtype = top_trained(path, args)
    groups = prompted_groups(args, model.config.vocab_size, stagger=37)
    data = [replace(r, passed=True, reward=1.0) for g in groups for r in g]  # warm-start data: solved episodes
    caches = {}

    def first_epoch(fill: bool):
        def run() -> None:
            trunk = caches[fill] = TrunkCache(model, args.trainable_layers)
            if fill:
                trunk.fill(sft_sequences(data), pad_id, args.micro_batch_tokens, compute_dtype)
            sft_epoch(model, optimizer, data, pad_id, batch_size=4, micro_batch_tokens=args.micro_batch_tokens,
                      grad_clip=1.0, rng=random.Random(0), compute_dtype=compute_dtype, trunk=trunk, share_prefix=True)
        return run

    t_fill, t_capture = timed_pair(first_epoch(True), first_epoch(False), iters, args.device)
    if not (caches[True].enabled and caches[True].share_ok):
        raise SystemExit(f"(h) the filled cache: enabled={caches[True].enabled}, shared passes ok={caches[True].share_ok}")
    out = {"trunk_fill_first_epoch_s": t_fill, "trunk_capture_first_epoch_s": t_capture,
           "trunk_fill_ratio_capture_over_fill": t_capture / t_fill}
    print(f"(h)  first warm-start epoch, trunk states kept before it {t_fill:.2f} s, kept during its full passes "
          f"{t_capture:.2f} s (ratio {t_capture / t_fill:.2f}; {len(data)} sequences, {args.shared_prompt}-token prompt)")
    return out


# ---------------------------------------------------------------- (g) the head at scored pairs vs at scored positions


def bench_scored_head(path: Path, args: argparse.Namespace, iters: int) -> dict[str, float]:
    import contextlib
    import random

    import carl.train.step
    import carl.train.warm_start
    from carl.train.warm_start import TrunkCache, sft_epoch

    tokenizer, model, optimizer, pad_id, compute_dtype = top_trained(path, args)
    groups = synthetic_groups(args.batch, args.seq_len, args.gen_frac, model.config.vocab_size, stagger=37)
    data = [replace(r, passed=True, reward=1.0) for g in groups for r in g]
    trunk = TrunkCache(model, args.trainable_layers)
    sft_epoch(model, optimizer, data, pad_id, batch_size=4, micro_batch_tokens=args.micro_batch_tokens, grad_clip=1.0,
              rng=random.Random(0), compute_dtype=compute_dtype, trunk=trunk)  # keeps the trunk's states
    if not trunk.enabled:
        raise SystemExit(f"(g) the trunk cache turned itself off at --trainable-layers {args.trainable_layers}")

    @contextlib.contextmanager
    def head(union: bool):
        modules = (carl.train.warm_start, carl.train.step)
        kept = [m.sequence_logprobs for m in modules]
        if union:
            for m in modules:
                m.sequence_logprobs = union_head_logprobs
        try:
            yield
        finally:
            for m, f in zip(modules, kept):
                m.sequence_logprobs = f

    def epoch(union: bool):
        def run() -> None:
            with head(union):
                sft_epoch(model, optimizer, data, pad_id, batch_size=4, micro_batch_tokens=args.micro_batch_tokens,
                          grad_clip=1.0, rng=random.Random(0), compute_dtype=compute_dtype, trunk=trunk)
        return run

    cfg = RLConfig(sd_weight=0.0, micro_batch_tokens=args.micro_batch_tokens, share_prefix=False)

    def step(union: bool):
        def run() -> None:
            with head(union):
                rl_step(model, optimizer, None, groups, cfg, tokenizer, pad_id,
                        token_normalizer=float(args.batch * args.seq_len), compute_dtype=compute_dtype)
        return run

    t_epoch, t_epoch_union = timed_pair(epoch(False), epoch(True), iters, args.device)
    t_step, t_step_union = timed_pair(step(False), step(True), iters, args.device)
    scored = sum(sum(r.trajectory.segments[0].generated_mask_T) for r in data)
    out = {"head_sft_cached_epoch_pairs_s": t_epoch, "head_sft_cached_epoch_union_s": t_epoch_union,
           "head_sft_ratio_union_over_pairs": t_epoch_union / t_epoch,
           "head_step_pairs_s": t_step, "head_step_union_s": t_step_union,
           "head_step_ratio_union_over_pairs": t_step_union / t_step, "head_scored_tokens": scored}
    print(f"(g)  head at scored pairs vs at scored positions: warm-start epoch on the kept trunk states {t_epoch:.2f} s vs "
          f"{t_epoch_union:.2f} s (ratio {t_epoch_union / t_epoch:.2f}); rl_step {t_step:.2f} s vs {t_step_union:.2f} s "
          f"(ratio {t_step_union / t_step:.2f})")
    return out


def union_head_logprobs(model, token_ids_B_T, attention_mask_B_T, temperature=1.0, return_logits=False,
                        score_mask_B_T=None, inputs_embeds_B_T_D=None, prefix_len=0):
    """The baseline of (g): sequence_logprobs's scored path before 2026-12-07 (no shared prompt),
    the head at every position that some row scores, for every row."""
    from carl.rl.logprobs import right_padded, token_logprobs

    if prefix_len or return_logits or score_mask_B_T is None:
        raise SystemExit("(g) the baseline covers scored passes without a shared prompt or logits only")
    inputs = {"input_ids": token_ids_B_T} if inputs_embeds_B_T_D is None else {"inputs_embeds": inputs_embeds_B_T_D}
    model_mask_B_T = None if right_padded(attention_mask_B_T) else attention_mask_B_T
    targets_K = torch.nonzero(score_mask_B_T[:, 1:].any(0)).squeeze(-1) + 1
    logits_B_K_V = model(**inputs, attention_mask=model_mask_B_T, use_cache=False,
                         logits_to_keep=(targets_K - 1).to(token_ids_B_T.device)).logits
    scored_B_K = token_logprobs(logits_B_K_V, token_ids_B_T[:, targets_K], temperature)
    logprobs_B_T = scored_B_K.new_zeros(token_ids_B_T.shape).index_copy(1, targets_K, scored_B_K)
    return logprobs_B_T * attention_mask_B_T.to(logprobs_B_T.dtype)


# ---------------------------------------------------------------- helpers


def top_trained(path: Path, args: argparse.Namespace):
    """(tokenizer, model, AdamW, pad id, compute dtype) with the top --trainable-layers blocks trained."""
    tokenizer, model = load_model(path, torch.float32, args.device)
    optimizer = torch.optim.AdamW(set_trainable(model, args.trainable_layers), lr=1e-6)
    return tokenizer, model, optimizer, pad_token_id(tokenizer), DTYPES[args.dtype]


def timed_pair(fn_a, fn_b, iters: int, device: str) -> tuple[float, float]:
    """Median wall times of `iters` alternating runs of a and b, after one warm-up of each
    (alternating, so that a shared machine's changing load hits both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(iters + 1):
        for fn, out in ((fn_a, times[0]), (fn_b, times[1])):
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            if i > 0:
                out.append(time.perf_counter() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def model_folder(name: str, tmp: Path) -> Path:
    if name == "smollm2":
        from carl.engine.smollm2 import smollm2_path

        return smollm2_path()
    if name == "random-smollm2":
        return random_smollm2(tmp / "random-smollm2")
    return Path(name)


def random_smollm2(folder: Path) -> Path:
    """SmolLM2-135M's architecture with random weights and a two-token tokenizer (ids only matter)."""
    from transformers import LlamaConfig

    return save_random_llama(folder, LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2))


def save_random_llama(folder: Path, config) -> Path:
    """A Llama of `config` with random weights, and a tokenizer of <unk>, <s>, </s> (ids only matter)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="</s>").save_pretrained(folder)
    return folder

if __name__ == "__main__":
    main()
