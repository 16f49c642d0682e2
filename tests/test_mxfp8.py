"""MXFP8 quantization (OCP MX v1.0) against hand-worked vectors, and the FP8 MoE expert paths."""

import math

import pytest
import torch

from carl.systems.moe_fp8 import (
    LINEARS,
    fp8_rowwise_linear,
    moe_experts_forward,
    mxfp8_linear,
    quantize_rowwise_fp8,
)
from carl.systems.mxfp8 import dequantize_mx, fake_quantize_mx, quantize_mx

NAN = float("nan")
INF = float("inf")


def block(*head: float) -> torch.Tensor:
    """One 32-element block: the given values, then zeros."""
    x = torch.zeros(32)
    x[: len(head)] = torch.tensor(head)
    return x


def roundtrip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    elems, scales = quantize_mx(x)
    return elems.float(), scales, dequantize_mx(elems, scales)


# --------------------------------------------------------------------------- hand-worked vectors


def test_hand_worked_block():
    # amax 3 -> floor(log2 3) = 1 -> shared_exp = 1 - 8 = -7 -> E8M0 bits 127 - 7 = 120, X = 2^-7
    # elements: 1 * 128 = 128, -3 * 128 = -384, 0.1 * 128 = 12.8 -> nearest E4M3 (step 1 in [8, 16)) = 13
    elems, scales, values = roundtrip(block(1.0, -3.0, 0.1))
    assert scales.tolist() == [120]
    assert elems[:4].tolist() == [128.0, -384.0, 13.0, 0.0]
    assert values[:3].tolist() == [1.0, -3.0, 13 / 128]


def test_largest_value_lands_on_e4m3_max_when_representable():
    # 1.75 = 448 * 2^-8: shared_exp = floor(log2 1.75) - 8 = -8, and 1.75 * 2^8 = 448 exactly
    elems, scales, values = roundtrip(block(1.75, -0.5))
    assert scales.tolist() == [127 - 8]
    assert elems[:2].tolist() == [448.0, -128.0]
    assert values[:2].tolist() == [1.75, -0.5]


def test_saturates_to_448_instead_of_overflowing():
    # amax 500 -> shared_exp = 8 - 8 = 0, X = 1; 500 > 448 clamps (the spec's "clamping normal numbers")
    elems, scales, _ = roundtrip(block(500.0, -511.0, 1.0))
    assert scales.tolist() == [127]
    assert elems[:3].tolist() == [448.0, -448.0, 1.0]


def test_rounds_to_nearest_even():
    # X = 1 (amax 448); in [256, 512) E4M3 steps by 32: 272 ties 256/288 -> 256 (even mantissa 000),
    # 304 ties 288/320 -> 320 (even mantissa 010); 300 -> 288 (nearest)
    elems, scales, _ = roundtrip(block(448.0, 272.0, 304.0, 300.0))
    assert scales.tolist() == [127]
    assert elems[:4].tolist() == [448.0, 256.0, 320.0, 288.0]


def test_all_zero_block_gets_smallest_scale_and_zero_elements():
    elems, scales, values = roundtrip(torch.zeros(32))
    assert scales.tolist() == [0]  # 2^-127: log2(0) = -inf clamps to the bottom of E8M0
    assert (elems == 0).all() and (values == 0).all()


def test_nan_marks_the_whole_block_nan_and_only_that_block():
    x = torch.cat([block(1.0, NAN, 2.0), block(1.0, 2.0)])
    _, scales, values = roundtrip(x)
    assert scales.tolist() == [0xFF, 127 + 1 - 8]
    assert values[:32].isnan().all()
    assert values[32:34].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("value", [INF, -INF])
def test_infinity_marks_the_block_nan(value):
    # E4M3 and E8M0 have no infinity; the block is marked NaN rather than silently saturated
    _, scales, values = roundtrip(block(1.0, value))
    assert scales.tolist() == [0xFF]
    assert values.isnan().all()


def test_e4m3_subnormals_and_flush_to_zero():
    # amax 1 -> X = 2^-8. Scaled values: 2^-16 -> 2^-8 (E4M3 subnormal, 2 * 2^-9);
    # 2^-18 -> 2^-10, a tie between 0 and 2^-9 -> 0 (even); 3 * 2^-18 -> 1.5 * 2^-9, a tie -> 2 * 2^-9
    elems, scales, values = roundtrip(block(1.0, 2.0**-16, 2.0**-18, 3 * 2.0**-18))
    assert scales.tolist() == [127 - 8]
    assert elems[1:4].tolist() == [2.0**-8, 0.0, 2.0**-8]
    assert values[1:4].tolist() == [2.0**-16, 0.0, 2.0**-16]


def test_tiny_values_clamp_the_scale_at_2_pow_minus_127():
    # amax 2^-130 wants shared_exp -138, clamps to -127: elements become 2^-3, still exact
    elems, scales, values = roundtrip(torch.full((32,), 2.0**-130))
    assert scales.tolist() == [0]
    assert (elems == 2.0**-3).all() and (values == 2.0**-130).all()
    # 2^-140 * 2^127 = 2^-13 is below half the smallest E4M3 subnormal (2^-9): flushes to zero
    _, scales, values = roundtrip(torch.full((32,), 2.0**-140))
    assert scales.tolist() == [0] and (values == 0).all()
    # float32 subnormal input is handled too (frexp): 1e-40 keeps ~3 significant bits
    _, _, values = roundtrip(torch.full((32,), 1e-40))
    assert abs(values[0].item() - 1e-40) / 1e-40 < 2**-3


def test_huge_values_use_large_scales():
    big = torch.finfo(torch.float32).max  # ~ 1.999 * 2^127 -> shared_exp = 127 - 8 = 119
    elems, scales, values = roundtrip(block(big, 2.0**120))
    assert scales.tolist() == [127 + 119]
    assert elems[:2].tolist() == [448.0, 2.0]
    assert values[0].item() == 448.0 * 2.0**119 and values[1].item() == 2.0**120


def test_blocks_are_independent_and_last_partial_block_is_padded():
    x = torch.zeros(2, 70)
    x[:, 31] = 1000.0  # last element of block 0
    x[:, 32] = 0.001  # first element of block 1
    x[:, 69] = -7.0  # last element, in the 6-element partial block 2
    elems, scales = quantize_mx(x)
    assert elems.shape == (2, 70) and scales.shape == (2, 3)
    # block 0: floor(log2 1000) = 9 -> 1; block 1: floor(log2 0.001) = -10 -> -18; block 2: 2 - 8 = -6
    assert scales[0].tolist() == [127 + 1, 127 - 18, 127 - 6]
    values = dequantize_mx(elems, scales)
    assert values.shape == (2, 70)
    assert values[0, 32].item() == pytest.approx(0.001, rel=2**-4) and values[0, 69].item() == -7.0


def test_error_bound_on_random_bf16_matrix():
    """Per element: relative error <= 2^-4 in E4M3's normal range, absolute <= 2^-10 * X below it,
    and saturation (|x| / X in (448, 512)) loses exactly |x| - 448 X."""
    torch.manual_seed(0)
    x = (torch.randn(16, 256) * torch.logspace(-3, 3, 256)).to(torch.bfloat16)
    elems, scales = quantize_mx(x)
    values = dequantize_mx(elems, scales, dtype=torch.float32)
    scale = torch.ldexp(torch.ones(scales.shape), scales.float() - 127).repeat_interleave(32, dim=-1)
    err = (values - x.float()).abs()
    saturation = (x.float().abs() - 448 * scale).clamp(min=0)
    assert (err <= torch.maximum(x.float().abs() * 2**-4, scale * 2**-10) + saturation).all()
    assert err.max() > 0
    assert fake_quantize_mx(x).dtype == torch.bfloat16


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="x.dtype must be"):
        quantize_mx(torch.zeros(32, dtype=torch.float64))
    elems, scales = quantize_mx(torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"scales.shape must be \(4, 2\)"):
        dequantize_mx(elems, scales[:, :1])
    with pytest.raises(ValueError, match="elems.dtype must be float8_e4m3fn"):
        dequantize_mx(elems.float(), scales)


# --------------------------------------------------------------------------- FP8 linear paths


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def test_mxfp8_linear_forward_and_straight_through_backward():
    torch.manual_seed(0)
    x = torch.randn(48, 96, requires_grad=True)
    w = torch.randn(40, 96, requires_grad=True)
    y = mxfp8_linear(x, w)
    torch.testing.assert_close(y, fake_quantize_mx(x) @ fake_quantize_mx(w).T)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    # backward GEMMs quantize along their own reduction dims (O for grad x, N for grad w)
    torch.testing.assert_close(x.grad, fake_quantize_mx(grad_y) @ fake_quantize_mx(w.T.contiguous()).T)
    torch.testing.assert_close(
        w.grad, fake_quantize_mx(grad_y.T.contiguous()) @ fake_quantize_mx(x.T.contiguous()).T
    )
    assert 0 < rel_err(y, x @ w.T) < 0.06
    assert rel_err(x.grad, grad_y @ w) < 0.06 and rel_err(w.grad, grad_y.T @ x) < 0.06


def test_fp8_rowwise_linear_runs_scaled_mm_with_odd_shapes():
    torch.manual_seed(0)
    x = torch.randn(3, 37, 72, dtype=torch.bfloat16, requires_grad=True)  # 111 tokens, not a multiple of 16
    w = torch.randn(40, 72, dtype=torch.bfloat16, requires_grad=True)
    y = fp8_rowwise_linear(x, w)
    assert y.shape == (3, 37, 40) and y.dtype == torch.bfloat16
    reference = x.float() @ w.float().T
    assert 0 < rel_err(y, reference) < 0.08
    y.float().square().sum().backward()
    assert rel_err(w.grad, 2 * (reference.reshape(-1, 40)).T @ x.float().reshape(-1, 72)) < 0.1
    q, scale = quantize_rowwise_fp8(torch.tensor([[1.0, -448.0], [0.0, 0.0]]))
    assert scale.squeeze(-1).tolist() == [1.0, 1.0] and q.float().tolist() == [[1.0, -448.0], [0.0, 0.0]]


def test_moe_experts_forward_matches_hf_qwen3_moe_experts():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
    experts = Qwen3MoeExperts(config)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.1)
    torch.nn.init.normal_(experts.down_proj, std=0.1)
    hidden_N_H = torch.randn(50, 64)
    probs_N_E = torch.softmax(torch.randn(50, 8), dim=-1)
    weights_N_K, ids_N_K = probs_N_E.topk(2, dim=-1)
    expected = experts(hidden_N_H, ids_N_K, weights_N_K)
    ours = moe_experts_forward(hidden_N_H, ids_N_K, weights_N_K, experts.gate_up_proj, experts.down_proj)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    for name in ("mxfp8_emulated", "fp8_rowwise"):
        low = moe_experts_forward(
            hidden_N_H, ids_N_K, weights_N_K, experts.gate_up_proj, experts.down_proj, LINEARS[name]
        )
        assert 0 < rel_err(low, expected) < 0.1, name


def test_mxfp8_experts_train():
    """Straight-through backward: a few SGD steps on a fixed regression target lower the loss."""
    torch.manual_seed(0)
    num_tokens, hidden, inter = 64, 32, 32
    gate_up = (torch.randn(4, 2 * inter, hidden) * 0.2).requires_grad_()
    down = (torch.randn(4, hidden, inter) * 0.2).requires_grad_()
    hidden_N_H = torch.randn(num_tokens, hidden)
    ids_N_K = torch.stack([torch.randperm(4)[:2] for _ in range(num_tokens)])
    weights_N_K = torch.full((num_tokens, 2), 0.5)
    target_N_H = torch.randn(num_tokens, hidden) * 0.1
    losses = []
    for _ in range(30):
        out = moe_experts_forward(hidden_N_H, ids_N_K, weights_N_K, gate_up, down, mxfp8_linear)
        loss = (out - target_N_H).square().mean()
        losses.append(loss.item())
        gate_up.grad = down.grad = None
        loss.backward()
        with torch.no_grad():
            gate_up -= 0.5 * gate_up.grad
            down -= 0.5 * down.grad
    assert math.isfinite(losses[-1]) and losses[-1] < 0.5 * losses[0]
