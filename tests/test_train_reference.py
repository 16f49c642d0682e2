"""The KL reference that shares the policy's frozen trunk: the same log-probs as the full start
model, the same train step, and the full model wherever the split does not hold."""

import pytest
import torch
from tiny_hf import save_tiny_model
from train_fakes import token_rollout

from carl.engine.hf import load_model
from carl.rl.logprobs import pad_right, sequence_logprobs
from carl.train.config import RLConfig
from carl.train.loop import set_trainable
from carl.train.reference import FullReference, SharedTrunkReference, load_reference
from carl.train.step import rl_step


@pytest.fixture(scope="module", params=["llama", "qwen2_moe"])
def start_dir(request, tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp(request.param), arch=request.param)


def _drifted_policy(start_dir, trainable_layers=1):
    """The start model after some 'training' of its top block."""
    _, model = load_model(start_dir, torch.float32)
    set_trainable(model, trainable_layers)
    with torch.no_grad():
        for p in model.model.layers[-1].parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return model


def _batch():
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (20, 13, 17)]
    ids_B_T, attn_B_T = pad_right(rows, 0)
    mask_B_T = attn_B_T.bool() & (torch.arange(ids_B_T.shape[1]) >= 5)
    return ids_B_T, attn_B_T, mask_B_T


def test_the_shared_trunk_gives_the_full_reference_log_probs(start_dir):
    policy = _drifted_policy(start_dir)
    reference = load_reference(start_dir, policy, trainable_layers=1)
    assert isinstance(reference, SharedTrunkReference)
    assert len(reference.model.model.layers) == 1 and "top 1 blocks" in reference.describe()
    _, full = load_model(start_dir, torch.float32)
    ids_B_T, attn_B_T, mask_B_T = _batch()
    with torch.no_grad():
        with reference.capture(policy):
            policy_B_T = sequence_logprobs(policy, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T)
        got_B_T = reference.logprobs(ids_B_T, attn_B_T, mask_B_T, temperature=0.7)
        want_B_T = sequence_logprobs(full, ids_B_T, attn_B_T, temperature=0.7, score_mask_B_T=mask_B_T)
    torch.testing.assert_close(got_B_T, want_B_T, atol=1e-5, rtol=0)
    assert (policy_B_T - want_B_T).abs().max() > 1e-3  # the policy did drift: the check can fail


def test_a_train_step_matches_the_full_reference(start_dir):
    group = [token_rollout(list(range(3 + i, 23 + i)), [False] * 8 + [True] * 12, reward=r)
             for i, r in enumerate([1.0, 0.0, 0.5])]
    cfg = RLConfig(kl_coef=1.0)
    metrics = []
    for make_reference in (lambda p: load_model(start_dir, torch.float32)[1],
                           lambda p: load_reference(start_dir, p, trainable_layers=1)):
        policy = _drifted_policy(start_dir)
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
        metrics.append(rl_step(policy, opt, None, [group], cfg, None, 0, 64.0, reference=make_reference(policy)))
    full, shared = metrics
    assert full["kl/kl"] > 0
    for key in ("loss/kl", "kl/kl", "loss/grpo", "rl/grad_norm"):
        assert shared[key] == pytest.approx(full[key], rel=1e-5, abs=1e-9), key


def test_the_full_model_where_the_split_does_not_hold(start_dir):
    policy = _drifted_policy(start_dir)
    assert isinstance(load_reference(start_dir, policy, trainable_layers=0), FullReference)  # every block trains
    with torch.no_grad():
        policy.model.layers[0].input_layernorm.weight.add_(1e-3)  # the trunk no longer equals the start weights
    assert isinstance(load_reference(start_dir, policy, trainable_layers=1), FullReference)


def test_the_split_reference_needs_the_policy_pass_first(start_dir):
    reference = load_reference(start_dir, _drifted_policy(start_dir), trainable_layers=1)
    ids_B_T, attn_B_T, mask_B_T = _batch()
    with pytest.raises(RuntimeError, match="capture"):
        reference.logprobs(ids_B_T, attn_B_T, mask_B_T, temperature=1.0)


@pytest.mark.parametrize("form", ["full", "shared trunk"])
def test_a_shared_prompt_gives_the_reference_the_same_kl(start_dir, form):
    """With the rows' common prompt run once (rl.share_prefix), the reference scores the same
    log-probs as with full passes, in both of its forms, and runs the prompt once too."""
    prompt = list(range(40, 80))
    group = [token_rollout(prompt + list(range(3 + i, 23 + i)), [False] * 48 + [True] * 12, reward=r)
             for i, r in enumerate([1.0, 0.0, 0.5])]
    metrics, tokens = [], []
    for share in (True, False):
        policy = _drifted_policy(start_dir)
        reference = load_reference(start_dir, policy, trainable_layers=1) if form == "shared trunk" else \
            FullReference(load_model(start_dir, torch.float32)[1])
        assert isinstance(reference, SharedTrunkReference) == (form == "shared trunk")
        seen = [0]
        reference.model.model.layers[0].register_forward_pre_hook(lambda m, a, kw: seen.__setitem__(
            0, seen[0] + (a[0] if a else kw["hidden_states"]).shape[:2].numel()), with_kwargs=True)
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
        cfg = RLConfig(kl_coef=1.0, share_prefix=share)
        for _ in range(2):  # the first step checks the shared pass against the full one (the policy's)
            seen[0] = 0
            metrics.append(rl_step(policy, opt, None, [group], cfg, None, 0, 64.0, reference=reference))
        tokens.append(seen[0])
    shared, full = metrics[0], metrics[2]  # the first steps, from the same weights
    assert shared["rl/prefix_tokens_shared"] == 40 * 2 and full["rl/prefix_tokens_shared"] == 0
    assert full["kl/kl"] > 0
    for key in ("loss/kl", "kl/kl", "loss/grpo", "rl/grad_norm"):
        assert shared[key] == pytest.approx(full[key], rel=1e-5, abs=1e-9), key
    assert metrics[1]["kl/kl"] == pytest.approx(metrics[3]["kl/kl"], rel=1e-4)
    assert tokens == [40 + 3 * 20, 3 * 60]  # the reference's block: the prompt once, then every row's rest
