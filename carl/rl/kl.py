"""A KL penalty that holds the policy near a reference (the weights RL started from).

Legend: B = sequences in the batch, T = tokens per padded sequence.

On the model-sampled tokens (sampled from the policy itself, so the estimators are on-policy):

    d_t   = logprobs_t - ref_logprobs_t
    loss  = coef * sum_{b,t} mask * d_t^2 / 2 / token_normalizer          ("k2")
    kl    = mean over masked tokens of exp(-d_t) + d_t - 1                ("k3", reported)

Why k2 as the loss: for samples from the policy, the gradient of d^2 / 2 is d * grad(logprobs),
which is in expectation the gradient of KL(policy || reference); k3 is the unbiased,
non-negative estimate of the KL value itself (Schulman, "Approximating KL divergence", 2020), so
it is the number to watch. Same constant token normalizer as the GRPO loss (Dr. GRPO).
"""

from __future__ import annotations

import torch


def kl_to_reference_loss(
    logprobs_B_T: torch.Tensor,
    ref_logprobs_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    token_normalizer: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(sum of k2 over masked tokens / token_normalizer, metrics: kl (mean k3), num_tokens)."""
    if logprobs_B_T.shape != ref_logprobs_B_T.shape or logprobs_B_T.shape != mask_B_T.shape:
        raise ValueError(f"logprobs_B_T {tuple(logprobs_B_T.shape)}, ref_logprobs_B_T "
                         f"{tuple(ref_logprobs_B_T.shape)} and mask_B_T {tuple(mask_B_T.shape)}: expected equal shapes")
    mask_B_T = mask_B_T.bool()
    d_B_T = logprobs_B_T - ref_logprobs_B_T.detach()
    zeros = torch.zeros_like(d_B_T)
    loss = torch.where(mask_B_T, 0.5 * d_B_T.square(), zeros).sum() / token_normalizer
    with torch.no_grad():
        num_tokens = mask_B_T.sum()
        k3_B_T = torch.exp(-d_B_T) + d_B_T - 1
        kl = torch.where(mask_B_T, k3_B_T, zeros).sum() / num_tokens.clamp(min=1)
    return loss, {"kl": float(kl), "num_tokens": float(num_tokens)}
