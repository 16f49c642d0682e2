"""The scored-positions path of sequence_logprobs (output head only where needed) equals the full path."""

import pytest
import torch

from carl.engine.hf import load_model
from carl.rl.logprobs import pad_right, sequence_logprobs
from tests.tiny_hf import save_tiny_model


def test_scored_positions_match_full_head(tmp_path):
    torch.manual_seed(0)
    _, model = load_model(save_tiny_model(tmp_path / "m"), torch.float32)
    ids_B_T, attn_B_T = pad_right([list(range(5, 25)), list(range(30, 42))], pad_id=0)
    mask_B_T = torch.zeros_like(ids_B_T, dtype=torch.bool)
    mask_B_T[0, [3, 4, 5, 15]] = True
    mask_B_T[1, [6, 7, 11]] = True
    full_B_T, full_logits_B_T_V = sequence_logprobs(model, ids_B_T, attn_B_T, temperature=0.7, return_logits=True)
    part_B_T, scored = sequence_logprobs(model, ids_B_T, attn_B_T, temperature=0.7, return_logits=True,
                                         score_mask_B_T=mask_B_T)
    assert torch.allclose(part_B_T[mask_B_T], full_B_T[mask_B_T], atol=1e-5)
    assert torch.allclose(scored.at(0, [3, 15]), full_logits_B_T_V[0, [3, 15]], atol=1e-5)
    assert torch.allclose(scored.at(1, [11]), full_logits_B_T_V[1, [11]], atol=1e-5)


def test_scored_path_gradients_match(tmp_path):
    _, model = load_model(save_tiny_model(tmp_path / "m"), torch.float32)
    model.requires_grad_(True)
    ids_B_T, attn_B_T = pad_right([list(range(5, 21))], pad_id=0)
    mask_B_T = torch.zeros_like(ids_B_T, dtype=torch.bool)
    mask_B_T[0, 8:12] = True
    grads = []
    for score_mask in (None, mask_B_T):
        model.zero_grad()
        lp = sequence_logprobs(model, ids_B_T, attn_B_T, score_mask_B_T=score_mask)
        (lp * mask_B_T).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_the_head_runs_only_at_the_scored_pairs(tmp_path):
    """Rows that score different positions: the head sees one hidden state per scored (row, position)
    pair, not every row at every position some row scores, and the log-probs stay the full path's."""
    torch.manual_seed(0)
    _, model = load_model(save_tiny_model(tmp_path / "m"), torch.float32)
    ids_B_T, attn_B_T = pad_right([list(range(5, 25)), list(range(30, 50)), list(range(60, 72))], pad_id=0)
    mask_B_T = torch.zeros_like(ids_B_T, dtype=torch.bool)
    mask_B_T[0, [3, 4]] = True
    mask_B_T[1, [9, 10, 11]] = True
    mask_B_T[2, [6]] = True
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        part_B_T = sequence_logprobs(model, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T)
    finally:
        handle.remove()
    assert seen == [(1, 6, model.config.hidden_size)]  # 6 pairs; the positions some row scores would be 3 x 6
    full_B_T = sequence_logprobs(model, ids_B_T, attn_B_T)
    assert torch.allclose(part_B_T[mask_B_T], full_B_T[mask_B_T], atol=1e-5)
    assert (part_B_T[~mask_B_T] == 0).all()


def test_a_head_that_does_not_work_position_by_position_is_named(tmp_path):
    _, model = load_model(save_tiny_model(tmp_path / "m"), torch.float32)
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, args, out: out.reshape(-1, 1, out.shape[-1]))
    ids_B_T, attn_B_T = pad_right([list(range(5, 15))], pad_id=0)
    mask_B_T = torch.zeros_like(ids_B_T, dtype=torch.bool)
    mask_B_T[0, [4, 5]] = True
    try:
        with pytest.raises(RuntimeError, match="selected positions"):
            sequence_logprobs(model, ids_B_T, attn_B_T, score_mask_B_T=mask_B_T)
    finally:
        handle.remove()
