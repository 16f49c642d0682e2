import math

import pytest
import torch

from carl.rl.grpo import GRPOConfig, grpo_loss

LOG = math.log


def _case(advantage, rollout=None):
    logprobs = torch.tensor([[LOG(1.5), LOG(0.5)]], requires_grad=True)
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = grpo_loss(logprobs, old, torch.tensor([advantage]), mask, 0.2, 0.28, 2.0, rollout)
    loss.backward()
    return loss.item(), metrics, logprobs.grad[0].tolist()


def test_clipped_loss_positive_advantage_by_hand():
    # ratios 1.5 and 0.5; A = +1: token 1 clipped at 1.28 (no gradient), token 2 unclipped
    loss, metrics, grad = _case(1.0)
    assert loss == pytest.approx((-1.28 - 0.5) / 2)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert grad == pytest.approx([0.0, -0.5 / 2])  # d(-ratio)/dlogprob = -ratio, over B*T = 2


def test_clipped_loss_negative_advantage_by_hand():
    # A = -1: token 1 ratio 1.5 > 1.28 stays unclipped (pessimistic max), token 2 clipped at 0.8
    loss, metrics, grad = _case(-1.0)
    assert loss == pytest.approx((1.5 + 0.8) / 2)
    assert grad == pytest.approx([1.5 / 2, 0.0])
    assert metrics["clip_frac"] == pytest.approx(0.5)


def test_truncated_importance_weights_are_capped_and_detached():
    # old - rollout = log 3 and log 0.5 -> weights min(3, 2) = 2 and 0.5
    rollout = torch.tensor([[-LOG(3.0), -LOG(0.5)]], requires_grad=True)
    loss, metrics, grad = _case(1.0, rollout)
    assert loss == pytest.approx((-1.28 * 2 - 0.5 * 0.5) / 2)
    assert metrics["is_weight_max"] == pytest.approx(2.0)
    assert metrics["is_weight_min"] == pytest.approx(0.5)
    assert metrics["is_capped_frac"] == pytest.approx(0.5)
    assert grad == pytest.approx([0.0, -0.5 * 0.5 / 2])
    assert rollout.grad is None


def test_gradient_only_on_masked_tokens_and_constant_normalizer():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [True, False, False]])
    loss, metrics = grpo_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0, -2.0]), mask, 0.2, 0.2, 2.0, token_normalizer=100.0
    )
    loss.backward()
    # on-policy (ratio 1): loss = sum(-A) / 100 = (-1 - 1 + 2) / 100
    assert loss.item() == pytest.approx(0.0)
    expected = torch.tensor([[0.0, -0.01, -0.01], [0.02, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)
    assert metrics["num_tokens"] == 3.0


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="clip_eps_low"):
        GRPOConfig(clip_eps_low=1.5)
    with pytest.raises(ValueError, match="is_ratio_cap"):
        GRPOConfig(is_ratio_cap=0.5)
