"""Supervised warm start on expert trajectories (loss on model-generated tokens only).

    training tasks --scripted expert (carl.micro.expert), real sandboxes + harness + reward-->
        token-exact trajectories in the policy's chat template
    keep the ones that scored reward 1 --> next-token loss on the expert's (generated) tokens

The expert runs through the same `collect_groups` as RL rollouts, so its data has exactly the
prompt, tools and observations the policy will see.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import torch

from carl.harness.agent import EpisodeLimits
from carl.harness.tools.base import Tool
from carl.micro.expert import ExpertMistakes, expert_token_policy
from carl.rl.logprobs import pad_right, sequence_logprobs
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.rollout.rollout import Rollout, collect_groups
from carl.train.ranks import Ranks, idle_micro_batch
from carl.train.step import TrainSequence, autocast, micro_batches, pad_rows


def expert_rollouts(tasks: list[TaskRecord], tokenizer: Any, num_episodes: int, mistakes: ExpertMistakes,
                    limits: EpisodeLimits, tools: dict[str, Tool], sandbox: SandboxConfig,
                    seed: int, on_done: Callable[[Rollout], None] = lambda r: None,
                    summary: str = "notes") -> list[Rollout]:
    spread = round_robin_by_repo(tasks)
    chosen = [spread[i % len(spread)] for i in range(num_episodes)]
    groups = collect_groups(lambda t, j: expert_token_policy(tokenizer, chosen[t], mistakes, seed=seed * 7919 + t,
                                                             summary=summary),
                            chosen, 1, limits, tools, sandbox, on_done=on_done)
    return [g[0] for g in groups]


def round_robin_by_repo(tasks: list[TaskRecord]) -> list[TaskRecord]:
    """The tasks reordered to take one task of each repo in turn (repos in first-seen order), so
    that a few episodes already cover many repos: the agent must learn to copy names and paths
    from the task, not a few repos' names by heart."""
    by_repo: dict[str, list[TaskRecord]] = {}
    for t in tasks:
        by_repo.setdefault(t.repo, []).append(t)
    rounds = itertools.zip_longest(*by_repo.values())
    return [t for r in rounds for t in r if t is not None]


def sft_loss(logprobs_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood of the masked (model-generated) tokens."""
    maskf = mask_B_T.float()
    n = maskf.sum().clamp(min=1)
    loss = -(logprobs_B_T.float() * maskf).sum() / n
    return loss, {"nll": float(loss.detach()), "num_tokens": float(maskf.sum())}


def sft_sequences(rollouts: list[Rollout]) -> list[TrainSequence]:
    """The supervised sequences of the successful rollouts: their segments with generated tokens."""
    return [TrainSequence(s.token_ids_T, s.generated_mask_T, s.logprobs_T, 0.0)
            for r in rollouts if r.valid and r.passed for s in r.trajectory.segments if any(s.generated_mask_T)]


def sft_batches(rollouts: list[Rollout], batch_size: int) -> int:
    """Batches of one `sft_epoch` over `rollouts`."""
    return -(-len(sft_sequences(rollouts)) // batch_size)


def sft_epoch(model: Any, optimizer: Any, rollouts: list[Rollout], pad_id: int, batch_size: int,
              micro_batch_tokens: int, grad_clip: float, rng: random.Random, on_batch=None,
              compute_dtype: torch.dtype | None = None, ranks: Ranks = Ranks()) -> list[float]:
    """One pass over the successful rollouts' segments in random order; returns the batch losses.
    On N `ranks` each trains its share of every batch's micro-batches (carl.train.ranks)."""
    seqs = sft_sequences(rollouts)
    rng.shuffle(seqs)
    losses = []
    model.train()
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start : start + batch_size]
        total_tokens = sum(sum(s.generated_mask_T) for s in batch)
        optimizer.zero_grad(set_to_none=True)
        batch_loss = 0.0
        device = next(model.parameters()).device
        for micro in ranks.share(micro_batches(batch, micro_batch_tokens)):
            if micro is None:  # this rank has fewer micro-batches than the others
                idle_micro_batch(model, pad_id, device)
                continue
            ids_B_T, attn_B_T = (t.to(device) for t in pad_right([s.token_ids_T for s in micro], pad_id))
            mask_B_T = pad_rows([s.generated_mask_T for s in micro], ids_B_T.shape[1], torch.bool).to(device)
            with autocast(model, compute_dtype):
                logprobs_B_T = sequence_logprobs(model, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T)
            loss, m = sft_loss(logprobs_B_T, mask_B_T)
            loss = loss * (m["num_tokens"] / max(total_tokens, 1))  # token-weighted mean over the batch
            (loss * ranks.world).backward()  # FSDP averages gradients over ranks: this makes it their sum
            batch_loss += float(loss.detach())
        batch_loss = sum(ranks.gather(batch_loss))
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], grad_clip)
        optimizer.step()
        losses.append(batch_loss)
        if on_batch is not None:
            on_batch(batch_loss)
    return losses
