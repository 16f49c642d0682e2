"""Low-precision linear paths for MoE expert matmuls: MXFP8 (emulated) and per-row FP8 (`_scaled_mm`).

Every path computes y = x @ w.T for x (tokens, in) and w (out, in), and quantizes both operands
along the reduction dimension of each of the three training GEMMs, as MX training does
(OCP MX spec; torchao's MXLinear uses the same recipe):

    forward      y_N_O  = x_N_I  @ w_O_I.T      reduce over I: quantize rows of x and of w
    grad input   gx_N_I = gy_N_O @ w_O_I        reduce over O: rows of gy and of w.T
    grad weight  gw_O_I = gy_N_O.T @ x_N_I      reduce over N: rows of gy.T and of x.T

The backward is straight-through: rounding is treated as the identity, only the GEMMs run on
quantized operands. Legend: N tokens, I input features, O output features, E experts, K top-k,
H hidden, F expert intermediate size.

What runs where (the honest part):
- "mxfp8_emulated": quantize to MXFP8 (`carl.systems.mxfp8`, 32-element E8M0-scaled blocks),
  dequantize, matmul in the input dtype. Bit-faithful to MX numerics, on any device, and slower
  than bf16: it exists to measure MX error, not speed. Native MX GEMMs need block-scaled tensor
  cores (NVIDIA Blackwell, sm100); H100 (sm90) has FP8 tensor cores without MX block scaling,
  so on H100 MX is only emulated.
- "fp8_rowwise": E4M3 operands with one float32 scale per row (amax / 448) multiplied in by
  `torch._scaled_mm`, which uses the FP8 tensor cores on H100/H200 (sm89+) and also runs on CPU.
  This is what actually gets faster on H100; its scales are coarser than MX blocks.
- torchao's MX kernels are not used: torchao is not installed on our machines, and on H100 it
  would emulate MX as well.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from carl.systems.mxfp8 import E4M3_MAX, fake_quantize_mx

Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def mxfp8_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., I) @ w (O, I).T with MXFP8-emulated GEMMs in forward and backward."""
    return _apply(x, w, _mx_mm)


def fp8_rowwise_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (..., I) @ w (O, I).T with per-row-scaled E4M3 GEMMs (`torch._scaled_mm`), output in bf16."""
    return _apply(x, w, _rowwise_mm)


LINEARS: dict[str, Linear] = {
    "bf16": F.linear,
    "mxfp8_emulated": mxfp8_linear,
    "fp8_rowwise": fp8_rowwise_linear,
}


def moe_experts_forward(
    hidden_N_H: torch.Tensor,
    expert_ids_N_K: torch.Tensor,
    weights_N_K: torch.Tensor,
    gate_up_E_2F_H: torch.Tensor,
    down_E_H_F: torch.Tensor,
    linear: Linear = F.linear,
) -> torch.Tensor:
    """SwiGLU experts in the layout of HF Qwen3-MoE / Mixtral / OLMoE experts (`gate_up_proj`, `down_proj`).

    Tokens are grouped by expert (one sort), each expert runs its two matmuls through `linear`,
    and the outputs are summed back per token weighted by the gate weights.
    """
    num_experts, top_k = gate_up_E_2F_H.shape[0], expert_ids_N_K.shape[1]
    flat_ids_NK = expert_ids_N_K.reshape(-1)
    order_NK = torch.argsort(flat_ids_NK, stable=True)
    token_of_NK = order_NK // top_k
    counts_E = torch.bincount(flat_ids_NK, minlength=num_experts).tolist()
    x_NK_H = hidden_N_H[token_of_NK]
    gate_weight_NK_1 = weights_N_K.reshape(-1)[order_NK].unsqueeze(-1)

    outputs = []
    for expert, x_n_H in enumerate(torch.split(x_NK_H, counts_E)):
        if x_n_H.shape[0] == 0:
            continue
        gate_n_F, up_n_F = linear(x_n_H, gate_up_E_2F_H[expert]).chunk(2, dim=-1)
        outputs.append(linear(F.silu(gate_n_F) * up_n_F, down_E_H_F[expert]))
    y_NK_H = torch.cat(outputs) * gate_weight_NK_1.to(outputs[0].dtype)
    out_N_H = torch.zeros_like(hidden_N_H, dtype=y_NK_H.dtype)
    return out_N_H.index_add(0, token_of_NK, y_NK_H).to(hidden_N_H.dtype)


def quantize_rowwise_fp8(x_M_K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E4M3 rows with one float32 dequantization scale per row (amax / 448), shape (M, 1)."""
    amax_M_1 = x_M_K.abs().amax(dim=-1, keepdim=True).float()
    scale_M_1 = torch.where(amax_M_1 > 0, amax_M_1 / E4M3_MAX, 1.0)
    q_M_K = (x_M_K.float() / scale_M_1).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q_M_K, scale_M_1


# --------------------------------------------------------------------------- GEMMs a @ bt.T


def _mx_mm(a_M_K: torch.Tensor, bt_N_K: torch.Tensor) -> torch.Tensor:
    return fake_quantize_mx(a_M_K) @ fake_quantize_mx(bt_N_K).T


def _rowwise_mm(a_M_K: torch.Tensor, bt_N_K: torch.Tensor) -> torch.Tensor:
    # _scaled_mm wants K and N divisible by 16; zero padding leaves the product unchanged.
    num_rows, num_cols = a_M_K.shape[0], bt_N_K.shape[0]
    a_M_K = _pad(a_M_K, 16, 16)
    bt_N_K = _pad(bt_N_K, 16, 16)
    qa_M_K, scale_a_M_1 = quantize_rowwise_fp8(a_M_K)
    qb_N_K, scale_b_N_1 = quantize_rowwise_fp8(bt_N_K)
    y_M_N = torch._scaled_mm(
        qa_M_K, qb_N_K.T, scale_a=scale_a_M_1, scale_b=scale_b_N_1.reshape(1, -1), out_dtype=torch.bfloat16
    )  # qb.T is column-major, as _scaled_mm requires for its second operand
    return y_M_N[:num_rows, :num_cols]


def _pad(t_R_C: torch.Tensor, row_multiple: int, col_multiple: int) -> torch.Tensor:
    pad_rows, pad_cols = -t_R_C.shape[0] % row_multiple, -t_R_C.shape[1] % col_multiple
    return F.pad(t_R_C, (0, pad_cols, 0, pad_rows)) if pad_rows or pad_cols else t_R_C.contiguous()


class _QuantizedLinear(torch.autograd.Function):
    """y = mm(x, w); straight-through backward whose two GEMMs also go through `mm`."""

    @staticmethod
    def forward(ctx, x_N_I, w_O_I, mm):
        ctx.save_for_backward(x_N_I, w_O_I)
        ctx.mm = mm
        return mm(x_N_I, w_O_I).to(x_N_I.dtype)

    @staticmethod
    def backward(ctx, grad_y_N_O):
        x_N_I, w_O_I = ctx.saved_tensors
        grad_x_N_I = ctx.mm(grad_y_N_O, w_O_I.T).to(x_N_I.dtype) if ctx.needs_input_grad[0] else None
        grad_w_O_I = ctx.mm(grad_y_N_O.T, x_N_I.T).to(w_O_I.dtype) if ctx.needs_input_grad[1] else None
        return grad_x_N_I, grad_w_O_I, None


def _apply(x: torch.Tensor, w_O_I: torch.Tensor, mm: Callable) -> torch.Tensor:
    x_N_I = x.reshape(-1, x.shape[-1])
    y_N_O = _QuantizedLinear.apply(x_N_I, w_O_I, mm)
    return y_N_O.reshape(*x.shape[:-1], w_O_I.shape[0])
