"""Muon math on one device: agrees with torch.optim.Muon, orthogonalizes, matches AdamW's RMS,
cuts parameters at natural granularity, routes parameters between Muon and AdamW."""

import pytest
import torch

from carl.systems.muon import (
    MatrixBlocks,
    Muon,
    MuonConfig,
    from_matrices,
    muon_param_groups,
    newton_schulz,
    orthogonalize,
    per_head,
    to_matrices,
)
from carl.systems.tiny_moe import TinyMoeConfig, TinyMoeForCausalLM, next_token_loss


@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_torch_muon_with_moonshot_lr_adjustment(nesterov):
    gen = torch.Generator().manual_seed(0)
    shapes = [(16, 8), (8, 24), (12, 12)]
    mine = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in mine]
    initial = [p.detach().clone() for p in mine]
    opt = Muon(mine, MuonConfig(lr=0.01, weight_decay=0.1, momentum=0.9, nesterov=nesterov))
    ref = torch.optim.Muon(
        theirs, lr=0.01, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn="match_rms_adamw"
    )
    for _ in range(3):
        for p, q in zip(mine, theirs):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for p, q in zip(mine, theirs):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    assert all((p - p0).abs().max() > 1e-3 for p, p0 in zip(mine, initial))


@pytest.mark.parametrize("shape", [(32, 16), (16, 48), (24, 24)])
def test_newton_schulz_flattens_the_spectrum(shape):
    # Condition number 100: singular values from 0.1 to 10.
    gen = torch.Generator().manual_seed(1)
    U, _ = torch.linalg.qr(torch.randn(shape[0], shape[0], generator=gen))
    V, _ = torch.linalg.qr(torch.randn(shape[1], shape[1], generator=gen))
    k = min(shape)
    S = torch.logspace(-1, 1, k)
    G = U[:, :k] @ torch.diag(S) @ V[:, :k].T
    ortho = newton_schulz(G[None], steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)[0].float()
    s = torch.linalg.svdvals(ortho)
    # Keller Jordan's coefficients trade exactness for speed: S' lands in about (0.68, 1.14),
    # not at 1 (his post: "something like U S' V^T with S' ~ Uniform(0.5, 1.5)").
    assert 0.6 < s.min() and s.max() < 1.2, s
    # Same singular vectors: U^T O V is (close to) diagonal.
    core = U[:, :k].T @ ortho @ V[:, :k]
    off = core - torch.diag(torch.diagonal(core))
    assert off.abs().max() < 0.05


def test_update_rms_matches_adamw_scale():
    """0.2 * sqrt(max(A, B)) makes the step RMS about 0.2 * lr for any shape (Moonshot)."""
    gen = torch.Generator().manual_seed(2)
    lr = 0.01
    for shape in [(64, 16), (16, 64), (48, 48)]:
        p = torch.nn.Parameter(torch.zeros(shape))
        p.grad = torch.randn(shape, generator=gen)
        Muon([p], MuonConfig(lr=lr, weight_decay=0.0)).step()
        rms = p.detach().pow(2).mean().sqrt().item() / lr
        assert 0.15 < rms < 0.25, (shape, rms)


def test_blocks_round_trip_and_cut_per_head_and_per_expert():
    t = torch.arange(2 * 6 * 8, dtype=torch.float32).reshape(2, 6, 8)
    blocks = MatrixBlocks(row_blocks=3, col_blocks=2)
    m = to_matrices(t, blocks)
    assert m.shape == (12, 2, 4)
    assert torch.equal(m[0], t[0, 0:2, 0:4]) and torch.equal(m[1], t[0, 0:2, 4:8])
    assert torch.equal(m[2], t[0, 2:4, 0:4]) and torch.equal(m[6], t[1, 0:2, 0:4])
    assert torch.equal(from_matrices(m, blocks, t.shape), t)

    config = MuonConfig()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(4 * 8, 16, generator=gen)  # 4 heads of 8 rows
    by_head = orthogonalize(q, MatrixBlocks(row_blocks=4), config)
    for h in range(4):
        rows = slice(8 * h, 8 * h + 8)
        assert torch.equal(by_head[rows], orthogonalize(q[rows], MatrixBlocks(), config))
    assert not torch.allclose(by_head.float(), orthogonalize(q, MatrixBlocks(), config).float(), atol=1e-2)

    experts = torch.randn(3, 8, 5, generator=gen)
    by_expert = orthogonalize(experts, MatrixBlocks(), config)
    for e in range(3):
        assert torch.equal(by_expert[e], orthogonalize(experts[e], MatrixBlocks(), config))


def test_param_groups_route_matrices_to_muon_and_the_rest_to_adamw():
    c = TinyMoeConfig()
    model = TinyMoeForCausalLM(c)
    groups, adamw = muon_param_groups(model, per_head(c.num_heads, c.num_kv_heads))
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = {names[id(p)]: g["blocks"] for g in groups for p in g["params"]}
    adamw_names = {names[id(p)] for p in adamw}

    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= adamw_names
    assert "model.layers.0.input_layernorm.weight" in adamw_names
    assert muon_names["model.layers.0.self_attn.q_proj.weight"] == MatrixBlocks(row_blocks=c.num_heads)
    assert muon_names["model.layers.0.self_attn.k_proj.weight"] == MatrixBlocks(row_blocks=c.num_kv_heads)
    assert muon_names["model.layers.0.self_attn.o_proj.weight"] == MatrixBlocks(col_blocks=c.num_heads)
    assert muon_names["model.layers.0.mlp.experts.gate_up_proj"] == MatrixBlocks(row_blocks=2)
    assert muon_names["model.layers.0.mlp.experts.down_proj"] == MatrixBlocks()
    assert muon_names["model.layers.0.mlp.gate.weight"] == MatrixBlocks()
    assert len(muon_names) + len(adamw_names) == len(list(model.parameters()))

    model.lm_head.weight = model.model.embed_tokens.weight  # tied: once, on the AdamW side
    groups, adamw = muon_param_groups(model)
    assert sum(p is model.lm_head.weight for p in adamw) == 1
    assert all(p is not model.lm_head.weight for g in groups for p in g["params"])

    # A whole training step with both optimizers lowers the loss on a fixed batch.
    opts = [Muon(groups, MuonConfig(lr=0.02)), torch.optim.AdamW(adamw, lr=1e-2)]
    batch = torch.randint(0, c.vocab_size, (4, 12), generator=torch.Generator().manual_seed(4))
    losses = []
    for _ in range(5):
        loss = next_token_loss(model, batch)
        loss.backward()
        losses.append(loss.item())
        for opt in opts:
            opt.step()
            opt.zero_grad()
    assert losses[-1] < losses[0] - 0.1, losses


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="momentum"):
        MuonConfig(momentum=1.0)
    with pytest.raises(ValueError, match="ns_steps"):
        MuonConfig(ns_steps=0)
    with pytest.raises(ValueError, match="blocks"):
        Muon([{"params": [torch.nn.Parameter(torch.zeros(6, 4))], "blocks": MatrixBlocks(row_blocks=4)}])
    with pytest.raises(ValueError, match="dims"):
        Muon([torch.nn.Parameter(torch.zeros(6))])
