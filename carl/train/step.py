"""One RL train step: Dr. GRPO on every valid rollout plus self-distillation at the turns that erred.

Legend: B = sequences in a micro-batch, T = tokens, N = scored tokens (flattened), V = vocabulary.

    groups of rollouts
      -> advantages per group (reward - group mean over valid members)
      -> one training sequence per token segment (ids, generated mask, rollout log-probs, advantage)
      -> teacher contexts for the error turns of each segment (hint inserted before the turn)
      -> micro-batches (the prompt every sequence starts with counted once: carl.train.prefix)
      -> per micro-batch: student forward (grad) -> GRPO loss on sampled tokens
                          reference forward (no grad; rl.kl_coef > 0) -> KL penalty on sampled tokens
                          teacher forward (no grad) -> top-k KL at the error turns' tokens
      -> clip grad norm, optimizer step, scheduler step

`old_logprobs` are the trainer's own log-probs before the update (one update per batch: ratio 1,
the PPO clip matters only for reused batches), and the truncated importance weight
exp(old - rollout) corrects for the sampler being another numeric path or an older version
(async staleness > 0 uses the same step unchanged).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from carl.rl.advantages import group_advantages
from carl.rl.grpo import grpo_loss
from carl.rl.kl import kl_to_reference_loss
from carl.rl.logprobs import pad_right, sequence_logprobs
from carl.rl.mismatch import add_sums, mismatch_metrics, mismatch_sums
from carl.rl.self_distill import (
    TeacherContext,
    build_teacher_context,
    find_error_turns,
    sampled_token_sd_loss,
    teacher_logits,
    topk_kl_loss,
)
from carl.train.config import RLConfig
from carl.train.prefix import checked_prefix_len, common_prefix_len, shared_cost
from carl.train.ranks import Ranks, idle_forward, idle_micro_batch, merge_metrics
from carl.train.reference import FullReference
from carl.rollout.rollout import Rollout


@dataclass
class TrainSequence:
    token_ids_T: list[int]
    generated_mask_T: list[bool]
    rollout_logprobs_T: list[float]
    advantage: float
    use_grpo: bool = True
    teachers: list[TeacherContext] = field(default_factory=list)
    routing: dict[str, Any] | None = None
    """The segment's recorded expert routes (MoE router replay), as `Segment.routing`."""


def rl_step(model: Any, optimizer: Any, scheduler: Any, groups: list[list[Rollout]], cfg: RLConfig,
            tokenizer: Any, pad_id: int, token_normalizer: float, teacher: Any = None,
            valid_tools: tuple[str, ...] = (), temperature: float = 1.0,
            compute_dtype: torch.dtype | None = None, reference: Any = None,
            ranks: Ranks = Ranks(), replay: Any = None) -> dict[str, float]:
    """One optimizer step on `groups`; `temperature` must be the one the rollouts sampled at, so that
    the trainer's log-probs and the sampler's describe the same distribution. `compute_dtype`
    (e.g. bf16) autocasts the forward passes while the weights and optimizer stay in fp32.
    `reference` (needed when cfg.kl_coef > 0; a frozen model or carl.train.reference's form of
    one) anchors the KL penalty. On N `ranks` (an FSDP2-sharded model, the same `groups` on every
    rank) each rank trains its share of the micro-batches (carl.train.ranks)."""
    if cfg.kl_coef > 0 and reference is None:
        raise ValueError(f"rl.kl_coef={cfg.kl_coef} needs a reference model (the weights RL started from)")
    if cfg.kl_coef == 0:
        reference = None
    elif isinstance(reference, torch.nn.Module):
        reference = FullReference(reference)
    built = build_sequences(groups, cfg, tokenizer, valid_tools)
    seqs = with_gradient(built, cfg)
    metrics: dict[str, float] = {"rl/num_sequences": float(len(seqs)),
                                 "rl/sequences_without_gradient": float(len(built) - len(seqs))}
    if not seqs:
        return metrics
    teacher = model if teacher is None else teacher
    model.train()
    optimizer.zero_grad(set_to_none=True)
    num_sd_tokens = sum(len(t.teacher_positions) for s in seqs for t in s.teachers)
    device = next(model.parameters()).device  # batches are built on the CPU, then moved
    totals = {"loss/grpo": 0.0, "loss/kl": 0.0, "loss/self_distill": 0.0}
    mismatch: dict[str, float] = {}  # trainer vs rollout log-probs (carl.rl.mismatch)
    # N ranks: every micro-batch runs the same sharded forwards on every rank, in this order:
    # policy, KL reference, self-distillation teacher, then the backward (idle ones where a rank has none)
    in_step = ((reference.model,) if reference is not None else ()) + ((teacher,) if cfg.sd_weight > 0 else ())
    lockstep = ranks.world > 1
    # the prompt every sequence starts with runs once per micro-batch (carl.train.prefix), in the
    # policy's pass and the KL reference's; not with router replay (it reads the policy's whole
    # pass) nor on N ranks (FSDP ranks must run the same passes)
    share = cfg.share_prefix and replay is None and not lockstep
    for micro in ranks.share(micro_batches(seqs, cfg.micro_batch_tokens, share_prefix=share)):
        if micro is None:  # this rank has fewer micro-batches than the others
            idle_micro_batch(model, pad_id, device, in_step)
            continue
        ids_B_T, attn_B_T = (t.to(device) for t in pad_right([s.token_ids_T for s in micro], pad_id))
        mask_B_T = pad_rows([s.generated_mask_T for s in micro], ids_B_T.shape[1], torch.bool).to(device)
        grpo_mask_B_T = mask_B_T & torch.tensor([s.use_grpo for s in micro], device=device)[:, None]
        rollout_B_T = pad_rows([s.rollout_logprobs_T for s in micro], ids_B_T.shape[1], torch.float32).to(device)
        advantages_B = torch.tensor([s.advantage for s in micro], device=device)
        need_logits = any(s.teachers for s in micro) and cfg.sd_weight > 0
        routes = replayed_routes(replay, micro, ids_B_T.shape[1], metrics)
        P = common_prefix_len([s.token_ids_T for s in micro], [s.generated_mask_T for s in micro]) if share else 0
        P = checked_prefix_len(model, ids_B_T, attn_B_T, mask_B_T, P, temperature)
        metrics["rl/prefix_tokens_shared"] = metrics.get("rl/prefix_tokens_shared", 0.0) + P * (len(micro) - 1)
        with autocast(model, compute_dtype), reference.capture(model) if reference else contextlib.nullcontext(), \
                replay.replay(routes) if routes is not None else contextlib.nullcontext():
            out = sequence_logprobs(model, ids_B_T, attn_B_T, temperature=temperature, return_logits=need_logits,
                                    score_mask_B_T=mask_B_T, prefix_len=P)
        logprobs_B_T, scored_logits = out if need_logits else (out, None)
        mismatch = add_sums(mismatch, mismatch_sums(logprobs_B_T, rollout_B_T, mask_B_T))

        loss, m = grpo_loss(logprobs_B_T, logprobs_B_T.detach(), advantages_B, grpo_mask_B_T,
                            cfg.clip_eps_low, cfg.clip_eps_high, cfg.is_ratio_cap,
                            rollout_logprobs_B_T=rollout_B_T, token_normalizer=token_normalizer)
        loss = cfg.grpo_weight * loss
        totals["loss/grpo"] += float(loss.detach())
        _accumulate(metrics, {f"grpo/{k}": v for k, v in m.items()}, weight=m["num_tokens"])

        if cfg.kl_coef > 0:
            with torch.no_grad(), autocast(reference.model, compute_dtype):
                ref_B_T = reference.logprobs(ids_B_T, attn_B_T, mask_B_T, temperature, prefix_len=P)
            kl, km = kl_to_reference_loss(logprobs_B_T, ref_B_T, mask_B_T, token_normalizer)
            kl = cfg.kl_coef * kl
            totals["loss/kl"] += float(kl.detach())
            _accumulate(metrics, {"kl/kl": km["kl"]}, weight=km["num_tokens"])
            loss = loss + kl

        if need_logits:
            contexts = [t for s in micro for t in s.teachers]
            with autocast(teacher, compute_dtype):
                t_logits_N_V = teacher_logits(teacher, contexts, pad_id)
            s_logits_N_V = torch.cat([scored_logits.at(b, t.student_positions) for b, s in enumerate(micro)
                                      for t in s.teachers])
            mask_N = torch.ones(s_logits_N_V.shape[0], dtype=torch.bool, device=device)
            if cfg.sd_loss == "topk":
                sd, sm = topk_kl_loss(s_logits_N_V, t_logits_N_V, mask_N, cfg.sd_topk)
            else:
                rows = torch.cat([logprobs_B_T[b, t.student_positions] for b, s in enumerate(micro) for t in s.teachers])
                targets = torch.tensor([t.teacher_ids[p] for s in micro for t in s.teachers for p in t.teacher_positions],
                                       device=device)
                teacher_lp_N = torch.log_softmax(t_logits_N_V, -1).gather(-1, targets[:, None])[:, 0]
                sd, sm = sampled_token_sd_loss(rows, teacher_lp_N, mask_N)
            # each micro-batch's mean KL weighted by its share of all scored tokens: a step-level mean
            sd = cfg.sd_weight * sd * (mask_N.sum() / max(num_sd_tokens, 1))
            totals["loss/self_distill"] += float(sd.detach())
            _accumulate(metrics, {f"sd/{k}": v for k, v in sm.items()}, weight=sm["num_tokens"])
            loss = loss + sd
        elif lockstep and cfg.sd_weight > 0:  # no teacher turns here; other ranks may have some
            idle_forward(teacher, pad_id, device)
        (loss * ranks.world).backward()  # FSDP averages gradients over ranks: this makes it their sum

    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # a DTensor on N ranks
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if ranks.world > 1:  # every rank's share of the sums
        same = {k: metrics[k] for k in ("rl/num_sequences", "rl/sequences_without_gradient")}  # alike on every rank
        metrics = merge_metrics(ranks.gather({**metrics, **dict.fromkeys(same, 0.0)})) | same
        totals = merge_metrics(ranks.gather(totals))
        mismatch = merge_metrics(ranks.gather(mismatch))
    metrics.update(totals)
    metrics["loss/total"] = sum(totals.values())
    metrics["rl/grad_norm"] = float(grad_norm)
    metrics["sd/num_turns"] = float(sum(len(s.teachers) for s in seqs))
    metrics.update(mismatch_metrics(mismatch))
    if replay is not None and replay.routes_replayed:  # the training router's own choice vs the engine's
        metrics["replay/route_mismatch_frac"] = replay.routes_differing / replay.routes_replayed
        replay.routes_replayed = replay.routes_differing = 0
    return _finish(metrics)


def build_sequences(groups: list[list[Rollout]], cfg: RLConfig, tokenizer: Any,
                    valid_tools: tuple[str, ...] = ()) -> list[TrainSequence]:
    """One TrainSequence per token segment of every valid rollout, with its teacher contexts."""
    seqs: list[TrainSequence] = []
    for group in groups:
        rewards_G = torch.tensor([r.reward for r in group], dtype=torch.float32)
        valid_G = torch.tensor([r.valid and r.trained and bool(r.trajectory.segments) for r in group])
        advantages_G = group_advantages(rewards_G, valid_G)
        if any(r.advantage is not None for r in group):  # the caller's own baseline
            advantages_G = torch.tensor([r.advantage or 0.0 for r in group], dtype=torch.float32)
        sibling = next((r.trajectory for r in group if r.valid and r.trained and r.passed), None)
        for r, adv, ok in zip(group, advantages_G.tolist(), valid_G.tolist()):
            if not ok or not any(any(s.generated_mask_T) for s in r.trajectory.segments):
                continue
            use_grpo = r.passed or not cfg.route_by_outcome
            has_demo = sibling is not None and not r.passed
            use_sd = (cfg.sd_weight > 0 and (not r.passed or not cfg.route_by_outcome)
                      and (has_demo or not cfg.sd_needs_success))
            teachers_by_segment: dict[int, list[TeacherContext]] = {}
            if use_sd:
                errors = find_error_turns(r.trajectory, None if r.passed else r.feedback,
                                          sibling if sibling is not r.trajectory else None, valid_tools,
                                          feedback_heading=r.feedback_heading)
                for e in errors:
                    try:
                        t = build_teacher_context(r.trajectory, e.turn, e.hint, tokenizer)
                    except ValueError:  # e.g. a turn cut by the token limit has no full run: skip it
                        continue
                    teachers_by_segment.setdefault(t.segment, []).append(t)
            summarized = {t.segment for t in r.trajectory.turns if t.is_summary}
            for i, seg in enumerate(r.trajectory.segments):
                mask_T = seg.generated_mask_T
                if i in summarized and not cfg.train_summaries:
                    mask_T = without_last_reply(mask_T)
                if not any(mask_T):  # e.g. a resumed segment cut by a limit before its first reply
                    continue
                seqs.append(TrainSequence(seg.token_ids_T, mask_T, seg.logprobs_T, adv,
                                          use_grpo, teachers_by_segment.get(i, []), seg.routing))
    return seqs


def with_gradient(seqs: list[TrainSequence], cfg: RLConfig) -> list[TrainSequence]:
    """The sequences whose loss has a gradient. Without a KL penalty, a sequence with advantage 0 (a
    group whose rewards were all equal) or outside GRPO, and without self-distillation turns, adds
    exactly 0 to every gradient: its forward and backward are skipped (20 of 84 sequences over the 5
    steps of a 2026-12-03 `make demo`, 0 in runs whose failed-call cost set every group's rewards
    apart). When none
    has a gradient, the shortest one stays, so that the optimizer still steps on all-zero gradients
    as it did before this cut (Adam's moments and step count move the same)."""
    if cfg.kl_coef > 0 or not seqs:
        return seqs
    kept = [s for s in seqs if (s.use_grpo and s.advantage != 0) or (cfg.sd_weight > 0 and s.teachers)]
    return kept or [min(seqs, key=lambda s: len(s.token_ids_T))]


def without_last_reply(mask_T: list[bool]) -> list[bool]:
    """The mask with its last run of generated tokens cleared: a segment that a self-summary ends
    has the summary as its last reply (the next segment starts right after it)."""
    end = len(mask_T)
    while end > 0 and not mask_T[end - 1]:
        end -= 1
    start = end
    while start > 0 and mask_T[start - 1]:
        start -= 1
    return mask_T[:start] + [False] * (len(mask_T) - start)


def replayed_routes(replay: Any, micro: list[TrainSequence], T: int, metrics: dict[str, float]) -> Any:
    """(L, B, T, K) routes to replay for a micro-batch, or None (no replay, or a segment without routes)."""
    if replay is None:
        return None
    from carl.engine.routing import segment_routes
    from carl.systems.router_replay import stack_routes

    routes = [segment_routes(s.routing, len(s.token_ids_T), replay.num_layers, replay.top_k) for s in micro]
    if any(r is None for r in routes):
        metrics["replay/micro_batches_free"] = metrics.get("replay/micro_batches_free", 0.0) + 1
        return None
    metrics["replay/micro_batches"] = metrics.get("replay/micro_batches", 0.0) + 1
    return stack_routes(routes, T)


def micro_batches(seqs: list[TrainSequence], max_tokens: int, share_prefix: bool = False) -> list[list[TrainSequence]]:
    """Greedy packing by padded size (longest sequence x count <= max_tokens; at least one each).
    With `share_prefix`, the size counts the rows' common prefix once (carl.train.prefix.shared_cost)."""
    batches: list[list[TrainSequence]] = []
    current: list[TrainSequence] = []
    for s in sorted(seqs, key=lambda s: len(s.token_ids_T)):
        rows = current + [s]
        if share_prefix:
            size = shared_cost([x.token_ids_T for x in rows], [x.generated_mask_T for x in rows])
        else:
            size = max(len(x.token_ids_T) for x in rows) * len(rows)
        if current and size > max_tokens:
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


def autocast(model: Any, compute_dtype: torch.dtype | None):
    """Mixed precision for a forward pass: fp32 master weights, `compute_dtype` matmuls.

    Pure bf16 weights would silently drop updates smaller than bf16's resolution (about 1e-3
    relative), i.e. most updates at RL learning rates.
    """
    device_type = next(model.parameters()).device.type
    enabled = compute_dtype is not None and compute_dtype != torch.float32
    return torch.autocast(device_type, dtype=compute_dtype if enabled else None, enabled=enabled)


def pad_rows(rows: list[list], T: int, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad per-token rows (masks, log-probs) with zeros to a [len(rows), T] tensor."""
    out = torch.zeros(len(rows), T, dtype=dtype)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def _accumulate(metrics: dict[str, float], m: dict[str, float], weight: float) -> None:
    """Token-weighted running sums; `_finish` turns them into means."""
    for k, v in m.items():
        if k.endswith("num_tokens"):
            metrics[k] = metrics.get(k, 0.0) + v
        else:
            metrics[k + "/_sum"] = metrics.get(k + "/_sum", 0.0) + v * weight
            metrics[k + "/_w"] = metrics.get(k + "/_w", 0.0) + weight


def _finish(metrics: dict[str, float]) -> dict[str, float]:
    out = {k: v for k, v in metrics.items() if not k.endswith(("/_sum", "/_w"))}
    for k in [k for k in metrics if k.endswith("/_sum")]:
        base = k.removesuffix("/_sum")
        out[base] = metrics[k] / max(metrics[base + "/_w"], 1e-9)
    return out
