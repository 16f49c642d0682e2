"""Per-token log-probs of token sequences under a model, shared by GRPO and self-distillation.

Legend: B = sequences in the batch, T = tokens per (right-padded) sequence, V = vocabulary.

Convention: `logprobs_B_T[b, t]` = log p(token t | tokens < t) for t >= 1, and 0 at t = 0 (the
first token has no context). That lines up with `Segment.logprobs_T` / `generated_mask_T`, so
a segment's recorded rollout log-probs and the trainer's recomputed ones index the same tokens.
The temperature must be the one the rollout sampled at (see carl.engine.batching).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_B_T, attention_mask_B_T) for sequences padded on the right to the longest one."""
    T = max(len(s) for s in seqs)
    ids_B_T = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids_B_T[b, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask_B_T[b, : len(s)] = 1
    return ids_B_T, mask_B_T


def token_logprobs(
    logits_B_T_V: torch.Tensor, targets_B_T: torch.Tensor, temperature: float = 1.0, chunk_T: int = 256
) -> torch.Tensor:
    """log softmax(logits / temperature) at `targets`, in fp32, without materialising the fp32 log-softmax.

    `logits_B_T_V[:, t]` must already be the logits that predict `targets_B_T[:, t]`. Works in
    chunks of `chunk_T` positions so the fp32 upcast of a long bf16 sequence stays small.
    """
    out = []
    for start in range(0, logits_B_T_V.shape[1], chunk_T):
        logits = logits_B_T_V[:, start : start + chunk_T].float()
        if temperature != 1.0:
            logits = logits / temperature
        target_logit = logits.gather(-1, targets_B_T[:, start : start + chunk_T, None])[..., 0]
        out.append(target_logit - torch.logsumexp(logits, dim=-1))
    return torch.cat(out, dim=1)


def sequence_logprobs(
    model: Any,
    token_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    temperature: float = 1.0,
    return_logits: bool = False,
    score_mask_B_T: torch.Tensor | None = None,
    inputs_embeds_B_T_D: torch.Tensor | None = None,
    prefix_len: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, "ScoredLogits"]:
    """Per-token log-probs (see module convention) of right-padded sequences under `model`.

    Gradients flow when called outside `torch.no_grad`. With `return_logits`, also returns the
    shifted logits `logits_B_T_V` (row t predicts token t; row 0 is zeros) that the top-k KL of
    self-distillation needs.

    With `score_mask_B_T` (True where a log-prob is needed, e.g. the generated tokens), the
    output head runs only at the N (row, position) pairs it selects (`scored_head`), which saves
    the B x T x V head (about a fifth of a small model's FLOPs) and its memory; other log-probs
    are 0, and `return_logits` then gives `ScoredLogits` (logits at those pairs only).

    With `inputs_embeds_B_T_D`, the model reads those vectors instead of embedding
    `token_ids_B_T` (which still name the targets): the split KL reference feeds its top blocks
    this way (carl/train/reference.py).

    With `prefix_len` P > 0 (needs `score_mask_B_T`; every row starts with the same P tokens and
    none is scored before position P + 1), the first P tokens run once at batch 1 and every row's
    rest attends to their cached keys and values (carl/train/prefix.py): same values, P x (B - 1)
    fewer tokens through the model.
    """
    inputs = {"input_ids": token_ids_B_T} if inputs_embeds_B_T_D is None else {"inputs_embeds": inputs_embeds_B_T_D}
    # right padding needs no mask: the causal one already hides every pad from every real token, and
    # without a mask the attention kernel skips the blocks above the diagonal (measured on 2 cores:
    # a warm-start epoch of whole rows, 125 s -> 91 s; on a GPU, sdpa's FlashAttention needs no mask)
    model_mask_B_T = None if right_padded(attention_mask_B_T) else attention_mask_B_T
    if score_mask_B_T is None:
        if prefix_len:
            raise ValueError("prefix_len needs score_mask_B_T (the positions whose log-probs are needed)")
        logits_B_T_V = model(**inputs, attention_mask=model_mask_B_T, use_cache=False).logits
        shifted = token_logprobs(logits_B_T_V[:, :-1], token_ids_B_T[:, 1:], temperature)
        logprobs_B_T = torch.cat([shifted.new_zeros((shifted.shape[0], 1)), shifted], dim=1)
        logprobs_B_T = logprobs_B_T * attention_mask_B_T.to(logprobs_B_T.dtype)
        if not return_logits:
            return logprobs_B_T
        aligned_B_T_V = torch.cat([torch.zeros_like(logits_B_T_V[:, :1]), logits_B_T_V[:, :-1]], dim=1)
        return logprobs_B_T, aligned_B_T_V
    rows_N, targets_N = torch.nonzero(score_mask_B_T[:, 1:], as_tuple=True)  # scored (row, t >= 1) pairs
    targets_N = targets_N + 1
    if len(targets_N) == 0:
        raise ValueError("score_mask_B_T selects no position t >= 1: nothing to score (drop such sequences)")
    if prefix_len:
        logits_1_N_V = _after_prefix(model, token_ids_B_T, attention_mask_B_T, rows_N, targets_N, prefix_len,
                                     inputs_embeds_B_T_D)
    else:
        with scored_head(model, rows_N, targets_N - 1):  # position t - 1 predicts token t
            logits_1_N_V = model(**inputs, attention_mask=model_mask_B_T, use_cache=False).logits
    if logits_1_N_V.shape[:2] != (1, len(targets_N)):
        raise RuntimeError(f"{type(model).__name__}: its output head gave logits of shape {tuple(logits_1_N_V.shape)} "
                           f"for {len(targets_N)} selected positions, expected (1, {len(targets_N)}, vocab): "
                           "carl.rl.logprobs.scored_head expects a head applied position by position to the last hidden states")
    scored_N = token_logprobs(logits_1_N_V, token_ids_B_T[rows_N, targets_N][None], temperature)[0]
    logprobs_B_T = scored_N.new_zeros(token_ids_B_T.shape).index_put((rows_N, targets_N), scored_N)
    logprobs_B_T = logprobs_B_T * attention_mask_B_T.to(logprobs_B_T.dtype)
    if not return_logits:
        return logprobs_B_T
    return logprobs_B_T, ScoredLogits(logits_1_N_V[0], rows_N, targets_N)


@contextlib.contextmanager
def scored_head(model: Any, rows_N: torch.Tensor, positions_N: torch.Tensor) -> Iterator[None]:
    """While inside, `model`'s output head reads its input's hidden states at the N pairs
    (rows_N[n], positions_N[n]) only, so a forward pass returns logits_1_N_V instead of B x T x V.

    A pre-hook on `get_output_embeddings()`: the model's own forward runs unchanged around it (an
    FSDP root's hooks, a LoRA-wrapped head, logit soft-capping after the head), only the head's
    matmul and everything after it shrink to the N rows. Against `logits_to_keep` with the positions
    any row scores (before 2026-12-07), it skips each row's unscored positions among those, which
    are most of them where rows' turns start at different offsets, as real episodes' do: a
    warm-start epoch on the trunk cache's kept states 1.21x faster, an RL step 1.04x (SmolLM2, 2-core
    Zen 4, rows of 1,650 tokens 10% scored; `benchmarks/trainer.py` part (g))."""
    head = model.get_output_embeddings()

    def pick(module: Any, args: tuple) -> tuple:
        h_B_T_D, *rest = args
        return (h_B_T_D[rows_N.to(h_B_T_D.device), positions_N.to(h_B_T_D.device)][None], *rest)

    handle = head.register_forward_pre_hook(pick)
    try:
        yield
    finally:
        handle.remove()


def right_padded(attention_mask_B_T: torch.Tensor) -> bool:
    """Whether every row is ones then zeros (real tokens, then padding): then the causal mask alone
    gives the real tokens the same attention, since no real token comes after a pad."""
    m = attention_mask_B_T.bool()
    return bool((m[:, 1:] <= m[:, :-1]).all() & m[:, 0].all())  # one device sync


def _after_prefix(model: Any, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor, rows_N: torch.Tensor,
                  targets_N: torch.Tensor, P: int, inputs_embeds_B_T_D: torch.Tensor | None) -> torch.Tensor:
    """logits_1_N_V predicting the tokens at (rows_N, targets_N), with the rows' common first P tokens run once."""
    B, first_target = ids_B_T.shape[0], int(targets_N.min())
    if not 0 < P < first_target:
        raise ValueError(f"prefix_len={P}: expected 0 < prefix_len < {first_target} (the first scored position)")
    if not bool((ids_B_T[:, :P] == ids_B_T[:1, :P]).all()) or not bool(attn_B_T[:, :P].all()):
        raise ValueError(f"prefix_len={P}: the rows differ within their first {P} tokens")
    if inputs_embeds_B_T_D is None:
        first, rest = {"input_ids": ids_B_T[:1, :P]}, {"input_ids": ids_B_T[:, P:]}
    else:  # the rows' vectors at the prefix are the same numbers (the same tokens): row 0's stand for all
        first, rest = {"inputs_embeds": inputs_embeds_B_T_D[:1, :P]}, {"inputs_embeds": inputs_embeds_B_T_D[:, P:]}
    cache = model(**first, attention_mask=attn_B_T[:1, :P], use_cache=True, logits_to_keep=1).cache
    cache.batch_repeat_interleave(B)  # new tensors of the graph: each row's gradient reaches the prefix pass
    with scored_head(model, rows_N, targets_N - 1 - P):  # the rest's positions count from P
        return model(**rest, attention_mask=attn_B_T, cache=cache, use_cache=True).logits


class ScoredLogits:
    """Logits at scored pairs: `logits_N_V[n]` predicts the token at position `positions_N[n]` of row `rows_N[n]`."""

    def __init__(self, logits_N_V: torch.Tensor, rows_N: torch.Tensor, positions_N: torch.Tensor):
        self.logits_N_V = logits_N_V
        self.index = {(int(b), int(t)): n for n, (b, t) in enumerate(zip(rows_N.tolist(), positions_N.tolist()))}

    def at(self, row: int, positions: Sequence[int]) -> torch.Tensor:
        """Logits predicting the tokens at `positions` of sequence `row` (each one it scored): logits_M_V."""
        return self.logits_N_V[[self.index[(row, p)] for p in positions]]
