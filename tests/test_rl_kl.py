"""The KL penalty to the reference policy: hand-computed values, its gradient, and what it does in a train step."""

import math

import pytest
import torch
from tiny_hf import save_tiny_model
from train_fakes import token_rollout

from carl.engine.hf import load_model
from carl.rl.kl import kl_to_reference_loss
from carl.rl.logprobs import pad_right, sequence_logprobs
from carl.train.config import RLConfig
from carl.train.loop import set_trainable
from carl.train.step import rl_step


def test_k2_loss_and_k3_kl_by_hand():
    logprobs_B_T = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]], requires_grad=True)
    ref_B_T = torch.tensor([[-1.5, -1.0, -9.0], [-3.0, -1.0, 0.0]])
    mask_B_T = torch.tensor([[True, True, False], [True, False, False]])  # d = 0.5, -1.0, 0.0 (masked: 8.5)
    loss, m = kl_to_reference_loss(logprobs_B_T, ref_B_T, mask_B_T, token_normalizer=10.0)
    assert float(loss.detach()) == pytest.approx((0.5 * 0.25 + 0.5 * 1.0 + 0.0) / 10.0)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1, 0.0]
    assert m["kl"] == pytest.approx(sum(k3) / 3) and m["num_tokens"] == 3.0
    loss.backward()  # the k2 gradient is d / normalizer on masked tokens, 0 elsewhere
    torch.testing.assert_close(logprobs_B_T.grad, torch.tensor([[0.05, -0.1, 0.0], [0.0, 0.0, 0.0]]))


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="ref_logprobs_B_T"):
        kl_to_reference_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 1.0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _seq(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (20,), generator=g).tolist()
    return ids, [False] * 10 + [True] * 6 + [False] * 4


def _kl(model, reference, rollouts):
    ids_B_T, attn_B_T = pad_right([r.trajectory.segments[0].token_ids_T for r in rollouts], 0)
    mask_B_T = torch.tensor([r.trajectory.segments[0].generated_mask_T for r in rollouts])
    with torch.no_grad():
        lp, ref = (sequence_logprobs(m, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T) for m in (model, reference))
    return kl_to_reference_loss(lp, ref, mask_B_T, 1.0)[1]["kl"]


def test_the_penalty_pulls_a_drifted_policy_back_to_the_reference(tiny_dir):
    """Equal rewards: GRPO gives no gradient, so the step is the KL penalty alone, and it must shrink the KL."""
    _, reference = load_model(tiny_dir, torch.float32)
    _, model = load_model(tiny_dir, torch.float32)
    with torch.no_grad():
        for p in model.model.layers[-1].parameters():
            p.add_(0.005 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    opt = torch.optim.SGD(set_trainable(model, 1), lr=1e-5)  # a random tiny model is steep: small steps
    group = [token_rollout(*_seq(i), reward=1.0) for i in range(3)]
    before = _kl(model, reference, group)
    cfg = RLConfig(kl_coef=1.0, grad_clip=1e9)
    metrics = rl_step(model, opt, None, [group], cfg, None, 0, token_normalizer=1.0, reference=reference)
    assert metrics["loss/grpo"] == 0.0 and metrics["loss/kl"] > 0
    assert metrics["kl/kl"] == pytest.approx(before, rel=1e-4)
    assert _kl(model, reference, group) < 0.8 * before


def test_an_identical_reference_costs_nothing_and_a_missing_one_is_an_error(tiny_dir):
    _, reference = load_model(tiny_dir, torch.float32)
    _, model = load_model(tiny_dir, torch.float32)
    opt = torch.optim.SGD(set_trainable(model, 0), lr=1.0)
    group = [token_rollout(*_seq(i), reward=r) for i, r in enumerate([1.0, 0.0])]
    metrics = rl_step(model, opt, None, [group], RLConfig(kl_coef=0.5), None, 0, 64.0, reference=reference)
    assert metrics["loss/kl"] == 0.0 and metrics["kl/kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["loss/total"] == pytest.approx(metrics["loss/grpo"])
    with pytest.raises(ValueError, match="rl.kl_coef"):
        rl_step(model, opt, None, [group], RLConfig(kl_coef=0.5), None, 0, 64.0)
