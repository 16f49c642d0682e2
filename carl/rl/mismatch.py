"""Trainer vs engine: how far the log-probs the engine reported are from the trainer's own.

Legend: B = sequences, T = tokens.

Silent drift between the inference engine and the trainer (another kernel, another dtype, a
tokenizer mismatch, weights that did not arrive) is the most common corruption in RL trackers:
the loss still goes down. Every RL step logs, over the model-sampled tokens,

    d = trainer log-prob - rollout log-prob        (the log of the IS ratio before truncation)
    mismatch/abs_diff_mean, abs_diff_max            |d|
    mismatch/log_ratio_mean                         mean d (a sign says which side is sharper)
    mismatch/frac_over_0.1                          share of tokens with |d| > 0.1 nats
    mismatch/ratio_std                              spread of exp(d), the IS ratio

Identical numerics give 0 everywhere; bf16 engines against an fp32-master trainer measured
|d| ~ 0.01-0.05 on a tiny model; a stale policy version (async RL) adds its own part.
"""

from __future__ import annotations

import math

import torch

THRESHOLD_NATS = 0.1


def mismatch_sums(trainer_B_T: torch.Tensor, rollout_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> dict[str, float]:
    """Sums over the masked tokens of one micro-batch (add them up over a step, then `mismatch_metrics`)."""
    with torch.no_grad():
        d = (trainer_B_T.detach().float() - rollout_B_T.float())[mask_B_T.bool()]
        r = torch.exp(d.clamp(max=20.0))  # a ratio of e^20 is already off every chart
        return {
            "n": float(d.numel()),
            "abs_sum": float(d.abs().sum()),
            "abs_max": float(d.abs().max()) if d.numel() else 0.0,
            "sum": float(d.sum()),
            "over": float((d.abs() > THRESHOLD_NATS).sum()),
            "r_sum": float(r.sum()),
            "r_sq_sum": float(r.square().sum()),
        }


def add_sums(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    out = dict(total)
    for k, v in part.items():
        out[k] = max(out.get(k, 0.0), v) if k == "abs_max" else out.get(k, 0.0) + v
    return out


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = sums.get("n", 0.0)
    if n == 0:
        return {}
    r_mean = sums["r_sum"] / n
    return {
        "mismatch/abs_diff_mean": sums["abs_sum"] / n,
        "mismatch/abs_diff_max": sums["abs_max"],
        "mismatch/log_ratio_mean": sums["sum"] / n,
        f"mismatch/frac_over_{THRESHOLD_NATS:g}": sums["over"] / n,
        "mismatch/ratio_std": math.sqrt(max(sums["r_sq_sum"] / n - r_mean * r_mean, 0.0)),
    }
