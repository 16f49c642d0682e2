"""Shared-prompt passes: the tokens every sequence of a micro-batch starts with run once.

Every training sequence starts with the same system prompt (carl's intro and tool list: 1,117
SmolLM2 tokens with all 11 tools, 625 with the embedded default's 4; a micro-world episode's rows
share about 770 with the task statement's common start), and a group's members the task too.
A micro-batch of B such sequences runs that common prefix once, at batch 1, keeping its keys and
values, then the B remainders against them:

    full:    B x [prefix | rest_b]                   -> B x T tokens through every block
    shared:  1 x [prefix] -> keys/values (batch 1 -> B)
             B x [rest_b] attending to them          -> P + B x (T - P) tokens

The prefix holds no scored token (it ends before the position whose logits predict the first
one), so its pass needs no logits; the gradient reaches it through the cached keys and values,
summed over the B rows, which is what B full passes give (tests/test_train_step.py). The first
shared pass of each model is checked against the full one (an architecture whose cache does not
mean "the earlier tokens" fails it) and sharing stays off for that model where they differ.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from carl.rl.logprobs import sequence_logprobs

MIN_PREFIX = 32
"""Shorter common prefixes are not worth a second forward call."""
CHECK_ATOL = 1e-2
"""Largest log-prob difference (fp32, any scored token) the check allows between the full and the
shared pass: different matmul shapes round differently (TF32 on GPUs), while a cache the model
misreads (wrong positions, ignored keys) moves log-probs by whole units."""

log = logging.getLogger(__name__)
_checked: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # model -> shared pass verified


def common_prefix_len(token_rows: list[list[int]], score_rows: list[list[bool]]) -> int:
    """Tokens that every row starts with, cut to end before the position whose logits predict the
    first scored token of any row (so every logit the loss needs comes from the rows' own passes);
    0 when shorter than MIN_PREFIX or for a single row."""
    if len(token_rows) < 2:
        return 0
    first = token_rows[0]
    n = min(len(r) for r in token_rows)
    for row in token_rows[1:]:
        n = next((i for i in range(n) if row[i] != first[i]), n)
    first_scored = min((m.index(True) for m in score_rows if any(m)), default=0)
    n = min(n, first_scored - 1)
    return n if n >= MIN_PREFIX else 0


def shared_cost(token_rows: list[list[int]], score_rows: list[list[bool]]) -> int:
    """Tokens a micro-batch of these rows runs with its common prefix shared (padded to the longest)."""
    P = common_prefix_len(token_rows, score_rows)
    return P + len(token_rows) * (max(len(r) for r in token_rows) - P)


def checked_prefix_len(model: Any, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor, score_mask_B_T: torch.Tensor,
                       prefix_len: int, temperature: float = 1.0) -> int:
    """`prefix_len`, or 0 for a model whose shared pass did not give the full pass's log-probs.
    The first call per model runs that check (two passes without gradient, fp32, at most 2 rows)."""
    if prefix_len and model not in _checked:
        _checked[model] = _agrees(model, ids_B_T[:2], attn_B_T[:2], score_mask_B_T[:2], prefix_len, temperature)
        if not _checked[model]:
            log.warning("shared-prefix passes differ from full ones for %s: every pass stays full",
                        type(model).__name__)
    return prefix_len if _checked.get(model, False) else 0


def _agrees(model: Any, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor, mask_B_T: torch.Tensor, prefix_len: int,
            temperature: float) -> bool:
    """Whether the shared and the full pass give the same log-probs (fp32, no gradient)."""
    device_type = ids_B_T.device.type
    with torch.no_grad(), torch.autocast(device_type, enabled=False):
        try:
            shared_B_T = sequence_logprobs(model, ids_B_T, attn_B_T, temperature=temperature, score_mask_B_T=mask_B_T,
                                           prefix_len=prefix_len)
        except (TypeError, ValueError, RuntimeError, AttributeError) as e:  # no cache support, shapes it rejects
            log.warning("shared-prefix pass failed (%s: %s)", type(e).__name__, e)
            return False
        full_B_T = sequence_logprobs(model, ids_B_T, attn_B_T, temperature=temperature, score_mask_B_T=mask_B_T)
    return bool(((shared_B_T - full_B_T).abs() * mask_B_T).max() <= CHECK_ATOL)
