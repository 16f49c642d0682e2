"""One optimizer step of next-token loss on packed rows, and the held-out evaluation, on 1 or N ranks.

Legend: B = rows in a micro-batch, T = data.seq_len, D = documents of a stream.

    train_step: the step's rows -> micro-batches of `micro_batch_size` rows
                -> rank r runs micro-batches r, r + N, ... (an idle one where it has fewer, so that
                   every rank runs the same FSDP collectives; carl.train.ranks)
                -> each micro-batch's loss = its targets' summed NLL / all targets of the step, x N
                   (FSDP averages gradients over ranks: x N makes it their sum, so N ranks take
                   the step one rank takes, up to float summation order)
                -> clip the global gradient norm -> optimizer step
    evaluate:   the held-out rows, shared the same way, without gradients -> NLL sum and target
                count per document, added over ranks -> losses per file, per source and per group

The forward passes position ids and no attention mask, so that attention stays within each
document (carl.midtrain.packing); it autocasts to model.dtype over fp32 master weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from carl.midtrain.packing import IGNORE, PackedStream, Rows, make_rows
from carl.rl.logprobs import token_logprobs
from carl.train.ranks import Ranks, idle_forward, idle_micro_batch
from carl.train.step import autocast

GROUPS = ("trained", "unseen", "general")
"""Held-out groups: files of the trained sources, of the held-out (unseen) sources, general data."""


def train_step(model: Any, optimizer: Any, stream: PackedStream, row_ids: list[int], seq_len: int,
               micro_batch_size: int, grad_clip: float, pad_id: int, compute_dtype: torch.dtype | None,
               ranks: Ranks = Ranks()) -> dict[str, float]:
    """One optimizer step on rows `row_ids` of `stream`; returns train/loss (mean NLL per target
    token), train/grad_norm and train/tokens (targets in the step)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    num_targets = sum(min(seq_len, len(stream.tokens_N) - 1 - i * seq_len) for i in row_ids)
    device = next(model.parameters()).device
    nll_sum = 0.0
    micro_batches = [row_ids[i : i + micro_batch_size] for i in range(0, len(row_ids), micro_batch_size)]
    for micro in ranks.share(micro_batches):
        if micro is None:  # this rank has fewer micro-batches than the others
            idle_micro_batch(model, pad_id, device)
            continue
        nll = rows_nll_B_T(model, make_rows(stream, micro, seq_len, pad_id), compute_dtype, device).sum()
        (nll / num_targets * ranks.world).backward()
        nll_sum += float(nll.detach())
    trainable = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, grad_clip)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # a DTensor on N ranks
    optimizer.step()
    return {"train/loss": sum(ranks.gather(nll_sum)) / num_targets, "train/grad_norm": float(grad_norm),
            "train/tokens": float(num_targets)}


def rows_nll_B_T(model: Any, rows: Rows, compute_dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """Negative log-likelihood of each target of `rows` (0 where there is none), in fp32."""
    targets_B_T = rows.targets_B_T.to(device)
    with autocast(model, compute_dtype):
        logits_B_T_V = model(input_ids=rows.input_ids_B_T.to(device), position_ids=rows.position_ids_B_T.to(device),
                             use_cache=False).logits
    logprobs_B_T = token_logprobs(logits_B_T_V, targets_B_T.clamp(min=0))
    return -logprobs_B_T * (targets_B_T != IGNORE)


@torch.no_grad()
def evaluate(model: Any, stream: PackedStream, seq_len: int, micro_batch_size: int, pad_id: int,
             compute_dtype: torch.dtype | None, ranks: Ranks = Ranks(),
             on_progress: Callable[[int, int], None] = lambda done, total: None) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sum, target count) per document of `stream` (float64 and int64 arrays of length D), on
    every rank; `on_progress(rows done, rows)` after each micro-batch (this rank's count x N)."""
    model.eval()
    device = next(model.parameters()).device
    num_docs = len(stream.starts_D)
    nll_D, count_D = np.zeros(num_docs), np.zeros(num_docs, dtype=np.int64)
    rows = list(range(stream.num_rows(seq_len)))
    shared = ranks.share([rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)])
    for n, micro in enumerate(shared, 1):
        if micro is None:  # this rank has fewer micro-batches than the others
            idle_forward(model, pad_id, device)
        else:
            batch = make_rows(stream, micro, seq_len, pad_id)
            nll_B_T = rows_nll_B_T(model, batch, compute_dtype, device).cpu().double().numpy()
            has_target = (batch.targets_B_T != IGNORE).numpy()
            docs = batch.docs_B_T.numpy()[has_target]
            nll_D += np.bincount(docs, weights=nll_B_T[has_target], minlength=num_docs)
            count_D += np.bincount(docs, minlength=num_docs)
        on_progress(min(len(rows), n * micro_batch_size * ranks.world), len(rows))
    parts = ranks.gather((nll_D, count_D))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def heldout_report(nll_D: np.ndarray, count_D: np.ndarray, docs: list[dict[str, str]]) -> tuple[dict, list[dict]]:
    """(metrics: heldout/<group> and heldout/<source> mean NLL per target token, token-weighted over
    their files; one row per file with its tokens and loss)."""
    files = [{**d, "tokens": int(n), "loss": float(s / n) if n else None} for d, s, n in zip(docs, nll_D, count_D)]
    parts = {f"heldout/{g}": [f for f in files if f["group"] == g] for g in GROUPS}
    parts |= {f"heldout/source/{s}": [f for f in files if f["source"] == s]
              for s in dict.fromkeys(d["source"] for d in docs if d["group"] != "general")}
    metrics = {}
    for name, rows in parts.items():
        tokens = sum(f["tokens"] for f in rows)
        if tokens:
            metrics[name] = sum(f["loss"] * f["tokens"] for f in rows if f["tokens"]) / tokens
    return metrics, files
