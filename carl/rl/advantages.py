"""Group-relative advantages (Dr. GRPO, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

Legend: G = rollouts in one group (same task).

advantage_i = reward_i - mean(reward_j over valid j). No division by the group's std (that
up-weights groups whose rewards barely differ) and no length normalisation (done in the loss by
a constant, see carl.rl.grpo). Rollouts whose infrastructure failed (sandbox crash, endpoint
down) are not evidence about the policy: they get advantage 0 and are left out of the mean,
never scored as reward 0.
"""

from __future__ import annotations

import torch


def group_advantages(rewards_G: torch.Tensor, valid_G: torch.Tensor) -> torch.Tensor:
    """Reward minus the mean over valid members; 0 for invalid members (and for all if none is valid)."""
    if rewards_G.shape != valid_G.shape or rewards_G.dim() != 1:
        raise ValueError(
            f"rewards_G {tuple(rewards_G.shape)} and valid_G {tuple(valid_G.shape)}: expected equal 1-D shapes"
        )
    valid_G = valid_G.bool()
    rewards_G = rewards_G.float()
    num_valid = valid_G.sum()
    if num_valid == 0:
        return torch.zeros_like(rewards_G)
    # where(), not a product: an invalid member's reward may be NaN
    mean = torch.where(valid_G, rewards_G, torch.zeros_like(rewards_G)).sum() / num_valid
    return torch.where(valid_G, rewards_G - mean, torch.zeros_like(rewards_G))
