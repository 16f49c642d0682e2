"""Episode streams: the random numbers of an episode named by (seed, episode key, turn).

A policy shared by many concurrent episodes seeds each request by default from its arrival order,
which depends on thread timing. An evaluation wants more: sample j of task t should draw the same
random numbers whenever it runs, beside whichever other episodes, under whichever weights. Then

- the same seed repeats an eval (up to last-bit differences from batch padding), and
- two checkpoints scored with one seed share their random numbers (common random numbers): the
  local sampler picks tokens by inverse CDF (`carl.engine.batching.sample_tokens`), so the two
  write the same tokens until their distributions differ around the shared uniform number, their
  episodes stay identical where the checkpoints agree, and the difference of their pass rates is
  less noisy than that of two independent evals.

`EpisodeStream` is that view of a token policy whose `generate` takes a `seed` (`HFEngine`),
`EpisodeChat` of a chat policy whose `chat` does (`OpenAIChatPolicy`: the request's `seed` field,
which vLLM, SGLang and llama.cpp's server honour; hosted APIs treat it as best effort).
`carl.eval.bench.evaluate` asks a policy for `episode(key)` with key "task id/sample index".
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from carl.types import Message


def stream_seed(seed: int, key: str, turn: int, bits: int = 63) -> int:
    """A `bits`-bit seed named by (seed, key, turn): stable across processes and Python versions."""
    digest = hashlib.blake2b(f"{seed}/{key}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - bits)


class EpisodeStream:
    """One episode's view of a token policy: turn t samples with generator seed stream_seed(seed, key, t)."""

    def __init__(self, policy: Any, seed: int, key: str):
        self.policy, self.seed, self.key, self.turns = policy, seed, key, 0
        self.tokenizer = policy.tokenizer

    @property
    def policy_version(self) -> int:
        return self.policy.policy_version

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int],
                 max_repeat_tokens: int = 0):
        seed = stream_seed(self.seed, self.key, self.turns)
        self.turns += 1
        return self.policy.generate(prompt_ids, max_new_tokens, stop_ids, seed=seed,
                                    max_repeat_tokens=max_repeat_tokens)


class EpisodeChat:
    """One episode's view of a chat policy: request t carries seed stream_seed(seed, key, t, 31 bits),
    which fits every server's seed type."""

    def __init__(self, policy: Any, seed: int, key: str):
        self.policy, self.seed, self.key, self.turns = policy, seed, key, 0

    def chat(self, messages: list[Message], max_new_tokens: int) -> str:
        seed = stream_seed(self.seed, self.key, self.turns, bits=31)
        self.turns += 1
        return self.policy.chat(messages, max_new_tokens, seed=seed)
