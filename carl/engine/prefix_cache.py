"""Prefix KV reuse: the key/value states of token sequences the policy has already run.

An agent episode calls the policy once per turn, and each turn's prompt is the previous prompt,
the ids sampled for it, and the tool's observation. Without reuse every turn prefills the whole
context again (measured on the embedded default: 60% of rollout time was prefill). The batcher
stores each finished request's cache row here (its prompt and the sampled ids it fed back) and
each fresh prompt's cache after its prefill; a new request starts from the longest stored
prefix and prefills only the rest. Sequences that share only a beginning (the system prompt and
the tool list, the task prompt of G rollouts of one task) reuse that part.

    store(ids_T, kv)          one entry per sequence; an entry that is a prefix of a new one is dropped
    match(prompt) -> n, kv    longest common prefix over entries, at most len(prompt) - 1 tokens
                              (the last prompt token is always fed, its logits give the first sample)
    clear()                   the weights changed: every stored state is stale

Entries are evicted least recently used first once they hold more than `max_tokens` positions.
Reused states were computed in another batch, so logits can differ from a full prefill in the
last bits (as batch composition already does); the trainer recomputes log-probs anyway and its
truncated importance ratio absorbs such differences.

Shapes: T = tokens of an entry, n = matched tokens, KV per layer: [1, heads, T, head_dim].
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [1, heads, T, head_dim]


@dataclass(eq=False)  # entries compare by identity (eviction removes this one)
class _Entry:
    ids_T: torch.Tensor  # int64 on CPU
    kv: KV
    last_used: int


class PrefixCache:
    """A least-recently-used store of per-sequence KV states, looked up by longest common prefix."""

    def __init__(self, max_tokens: int):
        if max_tokens < 0:
            raise ValueError(f"max_tokens: got {max_tokens}, expected >= 0 (0 disables prefix reuse)")
        self.max_tokens = max_tokens
        self._entries: list[_Entry] = []
        self._clock = itertools.count()
        self.reused_tokens = 0  # prompt tokens served from stored states
        self.prefilled_tokens = 0  # prompt tokens that were run through the model

    @property
    def num_tokens(self) -> int:
        return sum(len(e.ids_T) for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt_ids: list[int]) -> tuple[int, KV | None]:
        """(n, the first n positions of the best entry's KV) for the longest stored prefix of the prompt."""
        limit = len(prompt_ids) - 1
        if limit <= 0 or not self._entries:
            self._count(0, len(prompt_ids))
            return 0, None
        prompt_T = torch.tensor(prompt_ids[:limit], dtype=torch.long)
        best_n, best = 0, None
        for entry in self._entries:
            n = _common_prefix(entry.ids_T, prompt_T)
            if n > best_n:
                best_n, best = n, entry
        self._count(best_n, len(prompt_ids))
        if best is None:
            return 0, None
        best.last_used = next(self._clock)
        return best_n, [(k[:, :, :best_n], v[:, :, :best_n]) for k, v in best.kv]

    def store(self, ids: list[int], kv: KV) -> None:
        """Keep `kv` (cloned; per layer [1, heads, len(ids), head_dim]) as the state of `ids`."""
        if self.max_tokens == 0 or not ids or len(ids) > self.max_tokens:
            return
        if kv[0][0].shape[2] != len(ids):
            raise ValueError(f"kv holds {kv[0][0].shape[2]} positions for {len(ids)} ids")
        ids_T = torch.tensor(ids, dtype=torch.long)
        kept = []
        for entry in self._entries:
            n = _common_prefix(entry.ids_T, ids_T)
            if n == len(ids_T):  # already covered by a longer (or equal) entry
                entry.last_used = next(self._clock)
                return
            if n < len(entry.ids_T):  # not a prefix of the new sequence: keep it
                kept.append(entry)
        self._entries = kept
        self._entries.append(_Entry(ids_T, [(k.clone(), v.clone()) for k, v in kv], next(self._clock)))
        while self.num_tokens > self.max_tokens:
            self._entries.remove(min(self._entries, key=lambda e: e.last_used))

    def clear(self) -> None:
        self._entries = []

    def _count(self, reused: int, total: int) -> None:
        self.reused_tokens += reused
        self.prefilled_tokens += total - reused


def _common_prefix(a_T: torch.Tensor, b_T: torch.Tensor) -> int:
    m = min(len(a_T), len(b_T))
    differ = (a_T[:m] != b_T[:m]).nonzero()
    return int(differ[0, 0]) if len(differ) else m
