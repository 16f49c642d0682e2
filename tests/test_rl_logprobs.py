import pytest
import torch
from tiny_hf import save_tiny_model

from carl.engine.hf import load_model
from carl.rl.grpo import grpo_loss
from carl.rl.logprobs import pad_right, sequence_logprobs, token_logprobs


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    return load_model(folder, torch.float32)[1]


def test_token_logprobs_matches_log_softmax_in_chunks():
    logits = torch.randn(2, 7, 13)
    targets = torch.randint(0, 13, (2, 7))
    ref = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(token_logprobs(logits, targets, 0.7, chunk_T=3), ref, atol=1e-6)


def test_sequence_logprobs_right_padding_matches_unpadded_and_zero_at_first_and_pad(model):
    seqs = [[1, 5, 9, 12, 40], [1, 7, 3]]
    ids, mask = pad_right(seqs, pad_id=0)
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask)
        for b, s in enumerate(seqs):
            alone = sequence_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
            assert torch.allclose(lp[b, : len(s)], alone[0], atol=1e-5)
    assert lp[:, 0].abs().max() == 0 and lp[1, 3:].abs().max() == 0
    # position t holds log p(token t | tokens < t)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seqs[0][:3]])).logits[0, -1]
    assert lp[0, 3].item() == pytest.approx(torch.log_softmax(logits, -1)[12].item(), abs=1e-5)


def test_right_padded_rows_reach_the_model_without_a_mask_and_score_the_same(model):
    """Right padding: no attention mask goes to the model (the causal mask alone hides every pad
    from every real token, and the attention kernel can skip the blocks above the diagonal), with
    or without a score mask, and the real tokens score as they do unpadded. A row that does not
    start with real tokens (left padding) keeps its mask."""
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("attention_mask")), with_kwargs=True)
    seqs = [[1, 5, 9, 12, 40, 7], [1, 7, 3]]
    ids, mask = pad_right(seqs, pad_id=0)
    try:
        with torch.no_grad():
            whole = sequence_logprobs(model, ids, mask)
            scored = sequence_logprobs(model, ids, mask, score_mask_B_T=mask.bool())
            assert seen == [None, None]
            left = torch.tensor([[0, 0, 0, 1, 7, 3]]), torch.tensor([[0, 0, 0, 1, 1, 1]])
            sequence_logprobs(model, *left)
            assert seen[-1] is not None and seen[-1].equal(left[1])
    finally:
        handle.remove()
    for b, s in enumerate(seqs):
        with torch.no_grad():
            alone = sequence_logprobs(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
        torch.testing.assert_close(whole[b, : len(s)], alone[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(scored[b, 1 : len(s)], alone[0, 1:], atol=1e-5, rtol=0)
    assert whole[1, 3:].abs().max() == 0 and scored[1, 3:].abs().max() == 0


def test_grpo_gradients_reach_the_model_only_through_masked_tokens(model):
    """Zeroing the advantage of all tokens but one: parameters that only affect other tokens get no gradient."""
    ids = torch.tensor([[1, 5, 9, 12, 40, 41]])
    mask_tokens = torch.tensor([[False, False, False, True, True, False]])
    model.zero_grad()
    model.requires_grad_(True)
    lp = sequence_logprobs(model, ids, torch.ones_like(ids))
    loss, _ = grpo_loss(lp, lp.detach(), torch.tensor([1.0]), mask_tokens, 0.2, 0.2, 2.0)
    loss.backward()
    emb_grad = model.get_input_embeddings().weight.grad
    # the last input token (41) is only ever a target at an unmasked position and never an input
    # of a masked prediction, so its embedding row gets no gradient; earlier inputs do
    assert emb_grad[41].abs().max() == 0
    assert emb_grad[9].abs().max() > 0
    model.requires_grad_(False)
