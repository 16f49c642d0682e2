"""The Dr. GRPO policy loss with token-level truncated importance sampling.

Legend: B = sequences (rollout segments) in the batch, T = tokens per padded sequence.

Per model-sampled token t of sequence b (observations and padding are masked out):

    r      = exp(logprobs - old_logprobs)                       PPO ratio, trainer vs its old policy
    w      = min(exp(old_logprobs - rollout_logprobs), cap)     truncated IS weight, detached
    loss_t = w * max(-A_b * r, -A_b * clip(r, 1 - eps_low, 1 + eps_high))
    loss   = sum_{b,t} mask * loss_t / token_normalizer

- Clipping with separate low/high epsilons ("clip-higher", DAPO arXiv 2503.14476) keeps
  low-probability tokens explorable.
- Truncated IS (Yao et al., "Your efficient RL framework secretly brings you off-policy RL
  training", 2025; DESIGN.md 1.5): the rollout engine's log-probs differ from the trainer's
  (another numeric path, bf16, or a stale policy version under async RL). Weighting each token
  by the capped ratio old/rollout corrects that bias with bounded variance. Without rollout
  log-probs, w = 1.
- Dr. GRPO normalisation (arXiv 2503.20783): divide the token sum by a constant (e.g. group size
  x max generated tokens), not by each sequence's length, which would favour long wrong answers
  and short right ones. Use the same constant for every micro-batch of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GRPOConfig:
    clip_eps_low: float = 0.2
    """Lower PPO clip: the ratio is clipped at 1 - clip_eps_low."""
    clip_eps_high: float = 0.28
    """Upper PPO clip: the ratio is clipped at 1 + clip_eps_high (clip-higher, DAPO)."""
    is_ratio_cap: float = 2.0
    """Cap of the truncated importance weight old/rollout per token."""

    def __post_init__(self) -> None:
        if not 0 <= self.clip_eps_low < 1:
            raise ValueError(f"clip_eps_low: got {self.clip_eps_low}, expected a value in [0, 1)")
        if self.clip_eps_high < 0:
            raise ValueError(f"clip_eps_high: got {self.clip_eps_high}, expected >= 0")
        if self.is_ratio_cap < 1:
            raise ValueError(f"is_ratio_cap: got {self.is_ratio_cap}, expected >= 1")


def grpo_loss(
    logprobs_B_T: torch.Tensor,
    old_logprobs_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_B_T: torch.Tensor,
    clip_eps_low: float,
    clip_eps_high: float,
    is_ratio_cap: float,
    rollout_logprobs_B_T: torch.Tensor | None = None,
    token_normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over masked tokens; see the module docstring for the formula.

    `mask_B_T` is True on model-sampled tokens only. `token_normalizer` defaults to B * T (the
    padded size); pass a run constant (group size x max new tokens) for true Dr. GRPO scaling.
    Returns (loss, metrics): clip_frac, ratio_mean, is_weight_mean/min/max, is_capped_frac,
    num_tokens.
    """
    mask_B_T = mask_B_T.bool()
    maskf_B_T = mask_B_T.float()
    num_tokens = maskf_B_T.sum()
    advantages_B_T = advantages_B.float()[:, None].expand_as(logprobs_B_T)
    old_logprobs_B_T = old_logprobs_B_T.detach()

    ratio_B_T = torch.exp(logprobs_B_T - old_logprobs_B_T)
    unclipped_B_T = -advantages_B_T * ratio_B_T
    clipped_B_T = -advantages_B_T * ratio_B_T.clamp(1 - clip_eps_low, 1 + clip_eps_high)
    per_token_B_T = torch.maximum(unclipped_B_T, clipped_B_T)

    if rollout_logprobs_B_T is not None:
        raw_is_B_T = torch.exp(old_logprobs_B_T - rollout_logprobs_B_T.detach())
        is_weight_B_T = raw_is_B_T.clamp(max=is_ratio_cap)
    else:
        raw_is_B_T = is_weight_B_T = torch.ones_like(ratio_B_T)
    per_token_B_T = per_token_B_T * is_weight_B_T

    if token_normalizer is None:
        token_normalizer = float(mask_B_T.numel())
    loss = torch.where(mask_B_T, per_token_B_T, torch.zeros_like(per_token_B_T)).sum() / token_normalizer

    with torch.no_grad():
        denom = num_tokens.clamp(min=1)
        masked_is = is_weight_B_T[mask_B_T]
        metrics = {
            "clip_frac": float(((clipped_B_T > unclipped_B_T).float() * maskf_B_T).sum() / denom),
            "ratio_mean": float((ratio_B_T.detach() * maskf_B_T).sum() / denom),
            "is_weight_mean": float(masked_is.mean()) if masked_is.numel() else 1.0,
            "is_weight_min": float(masked_is.min()) if masked_is.numel() else 1.0,
            "is_weight_max": float(masked_is.max()) if masked_is.numel() else 1.0,
            "is_capped_frac": float(((raw_is_B_T > is_ratio_cap).float() * maskf_B_T).sum() / denom),
            "num_tokens": float(num_tokens),
        }
    return loss, metrics
