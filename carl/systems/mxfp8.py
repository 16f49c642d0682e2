"""MXFP8 quantization per the OCP Microscaling Formats (MX) specification v1.0.

An MX block is 32 consecutive elements along the last dimension. Each block stores one shared
scale X in E8M0 (an 8-bit biased power-of-two exponent: X = 2^(bits - 127), bits 0..254, and
0xFF = NaN; E8M0 has no zero and no infinity) and 32 private elements P_i in FP8 E4M3
(`torch.float8_e4m3fn`: bias 7, max normal 448, min normal 2^-6, min subnormal 2^-9, no
infinity, NaN = S.1111.111). A block decodes to X * P_i.

Scale choice (spec section 6.3):
    shared_exp = floor(log2(max_i |V_i|)) - emax_elem        emax_elem = 8 for E4M3 (448 = 1.75 * 2^8)
    X = 2^shared_exp, clamped to the E8M0 range 2^-127 .. 2^127
    P_i = quantize_to_E4M3(V_i / X), round to nearest even, normal numbers clamped (saturated) to +-448

Because floor() can leave the largest |V_i| / X anywhere in [256, 512), values in (448, 512)
saturate to 448: that is the spec's "clamping normal numbers", not an error.

Edge cases, and what this module does with each:
- all-zero block: log2(0) = -inf, so the scale clamps to 2^-127 (bits 0) and every P_i is 0.
- tiny values: the scale clamps at 2^-127, so V_i / X can fall below E4M3's normal range; it
  becomes an E4M3 subnormal (multiples of 2^-9) or flushes to zero when under 2^-10.
- huge values: float32 inputs never need a scale above 2^119 (amax < 2^128), the upper clamp at
  2^127 only matters for formats wider than float32, which this module does not accept.
- NaN anywhere in a block: the scale is the E8M0 NaN encoding 0xFF, and the whole block decodes
  to NaN (spec: if X is NaN every element of the block is NaN, whatever P_i holds).
- +-inf in a block: E4M3 has no infinity and E8M0 none either, so no finite encoding keeps it.
  We could not check the spec text on this point offline and chose the loud option: the block
  is marked NaN like a NaN block, so an overflow upstream is never turned into a finite 448*X.
- a last partial block (last dim not a multiple of 32) is padded with zeros for the scale
  computation; the padding is not returned.

Layout: `quantize_mx(x_..._K)` returns `elems_..._K` (float8_e4m3fn, same shape as x) and
`scales_..._NB` (uint8 E8M0 bits, NB = ceil(K / 32)). Computation is in float32, on any device.
"""

from __future__ import annotations

import torch

BLOCK_SIZE = 32
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
E4M3_EMAX = 8  # exponent of the largest normal E4M3 number (emax_elem in the spec)
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E8M0_MIN_EXP = -127  # bits 0x00
E8M0_MAX_EXP = 127  # bits 0xFE


def quantize_mx(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize `x` to MXFP8 (E4M3 elements, E8M0 scales) in blocks of 32 along the last dim.

    Returns `(elems, scales)`: `elems` is float8_e4m3fn with x's shape, `scales` is uint8 with
    shape `x.shape[:-1] + (ceil(K / 32),)` holding E8M0 bits. Accepts float32, bfloat16, float16.
    """
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"quantize_mx: x.dtype must be float32, bfloat16 or float16, got {x.dtype}")
    if x.ndim == 0:
        raise ValueError("quantize_mx: x must have at least one dimension (blocks run along the last)")
    blocks_NB_32, num_elems = _to_blocks(x.float())

    amax_NB = blocks_NB_32.abs().amax(dim=-1)  # NaN if the block holds a NaN
    nonfinite_NB = ~torch.isfinite(blocks_NB_32).all(dim=-1)
    # floor(log2(amax)) exactly, subnormals included: frexp gives amax = m * 2^e with m in [0.5, 1).
    _, exp_NB = torch.frexp(amax_NB)
    shared_exp_NB = (exp_NB - 1 - E4M3_EMAX).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    shared_exp_NB = torch.where(amax_NB == 0, E8M0_MIN_EXP, shared_exp_NB)
    shared_exp_NB = torch.where(nonfinite_NB, 0, shared_exp_NB)

    # V / X by exponent arithmetic: exact, also where X itself is a float32 subnormal (2^-127).
    scaled_NB_32 = torch.ldexp(blocks_NB_32, -shared_exp_NB.unsqueeze(-1).float())
    scaled_NB_32 = scaled_NB_32.clamp(-E4M3_MAX, E4M3_MAX)  # saturate; NaN passes through
    scaled_NB_32 = torch.where(nonfinite_NB.unsqueeze(-1), torch.nan, scaled_NB_32)
    elems_NB_32 = scaled_NB_32.to(torch.float8_e4m3fn)  # round to nearest even, subnormals kept

    scales_NB = torch.where(nonfinite_NB, E8M0_NAN, shared_exp_NB + E8M0_BIAS).to(torch.uint8)
    elems = elems_NB_32.reshape(*x.shape[:-1], -1)[..., :num_elems]
    return elems, scales_NB


def dequantize_mx(
    elems: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of `quantize_mx`: X * P_i per block, NaN for blocks whose scale is 0xFF."""
    if elems.dtype != torch.float8_e4m3fn:
        raise ValueError(f"dequantize_mx: elems.dtype must be float8_e4m3fn, got {elems.dtype}")
    if scales.dtype != torch.uint8:
        raise ValueError(f"dequantize_mx: scales.dtype must be uint8 (E8M0 bits), got {scales.dtype}")
    num_blocks = -(-elems.shape[-1] // BLOCK_SIZE)
    if scales.shape != (*elems.shape[:-1], num_blocks):
        raise ValueError(
            f"dequantize_mx: scales.shape must be {(*elems.shape[:-1], num_blocks)} for elems of shape "
            f"{tuple(elems.shape)}, got {tuple(scales.shape)}"
        )
    blocks_NB_32, num_elems = _to_blocks(elems.float())
    exp_NB = scales.int() - E8M0_BIAS
    values_NB_32 = torch.ldexp(blocks_NB_32, exp_NB.unsqueeze(-1).float())
    values_NB_32 = torch.where((scales == E8M0_NAN).unsqueeze(-1), torch.nan, values_NB_32)
    return values_NB_32.reshape(*elems.shape[:-1], -1)[..., :num_elems].to(dtype)


def fake_quantize_mx(x: torch.Tensor) -> torch.Tensor:
    """Round-trip through MXFP8 (quantize, then dequantize) in x's dtype: the emulation used on CPU."""
    return dequantize_mx(*quantize_mx(x), dtype=x.dtype)


def _to_blocks(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(..., K) -> (..., ceil(K/32), 32), zero-padding the last partial block; returns K too."""
    num_elems = x.shape[-1]
    pad = -num_elems % BLOCK_SIZE
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, BLOCK_SIZE), num_elems
