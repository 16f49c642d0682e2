import math

import torch

from carl.rl.advantages import group_advantages


def test_reward_minus_mean_over_valid_members_no_std_scaling():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    valid = torch.tensor([True, True, False, True, True])
    adv = group_advantages(rewards, valid)
    # mean over valid = (1 + 0 + 1 + 0) / 4 = 0.5; the invalid member gets 0, not 0 - 0.5
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.5, -0.5]


def test_invalid_member_with_nan_reward_does_not_poison_the_mean():
    adv = group_advantages(torch.tensor([2.0, float("nan"), 0.0]), torch.tensor([True, False, True]))
    assert adv.tolist() == [1.0, 0.0, -1.0]


def test_all_invalid_or_equal_rewards_give_zero():
    assert group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([False, False])).tolist() == [0.0, 0.0]
    assert group_advantages(torch.tensor([0.3, 0.3, 0.3]), torch.ones(3, dtype=torch.bool)).abs().max() < 1e-7


def test_no_std_normalisation():
    adv = group_advantages(torch.tensor([0.0, 10.0]), torch.tensor([True, True]))
    assert adv.tolist() == [-5.0, 5.0]  # a std-normalised GRPO would give [-1, 1] (or -0.707 with ddof=1)
    assert not math.isclose(adv[1].item(), 1.0)
