"""The repetition guard: a reply that loops on a short pattern stops long before its token limit.

A policy can degenerate into repeating a few tokens until `max_new_tokens` (seen in production: a
`read_file` path of 4,096 tokens of `/v`, 167 s for one turn). The guard watches the ids of one
generation and fires once its last `window` ids are one pattern of at most
`max_period(window)` ids repeated (at least 4 times). The turn is then cut right after that id
and records `finish_reason = "repeat"` (`carl.types.Turn`); the episode goes on, as after a turn
cut by its token limit.

One rule, two places, the same cut:

- the engine checks every sampled id and stops the row early (`carl.engine.hf.HFEngine`, through
  `generate(..., max_repeat_tokens=N)`), which is what saves the time;
- the harness checks each returned generation (`carl.harness.chat_tokens.TokenContext`) and cuts
  it where the guard fires, so an engine that cannot stop early (a vLLM server) or a scripted
  policy gives the trajectory an early-stopping engine would: sampling is causal, the ids before
  the cut are the same either way.

Training rollouts and production run the same harness with `EpisodeLimits.max_repeat_tokens`, so
both cut the same replies. Cost: `max_period` comparisons per sampled id.

Not covered: text-level policies (an OpenAI-compatible endpoint returns text, not ids), and
loops whose pattern is longer than 64 ids (a repeated paragraph): the token limit bounds those.
"""

from __future__ import annotations

from collections.abc import Sequence

LONGEST_PERIOD = 64
"""The longest pattern (in ids) the guard looks for, whatever the window."""


def max_period(window: int) -> int:
    """The longest pattern the guard looks for in a window of `window` ids: one that fits 4 times."""
    return min(LONGEST_PERIOD, window // 4)


class RepeatGuard:
    """Watches one generation; `push(id)` is True once the last `window` ids pushed are one
    pattern of p <= max_period(window) ids repeated (ids[i] == ids[i - p] over the window)."""

    def __init__(self, window: int):
        if window < 4:
            raise ValueError(f"max_repeat_tokens: got {window}, expected 0 (off) or >= 4")
        self.window = window
        self.ids: list[int] = []
        # run_P[p - 1]: how many of the last ids each equal the id p before them; the last
        # run + p ids are then p-periodic
        self.run_P = [0] * max_period(window)

    def push(self, token_id: int) -> bool:
        ids, fired = self.ids, False
        ids.append(token_id)
        for p in range(1, min(len(self.run_P), len(ids) - 1) + 1):
            if ids[-1 - p] == token_id:
                self.run_P[p - 1] += 1
                fired = fired or self.run_P[p - 1] + p >= self.window
            else:
                self.run_P[p - 1] = 0
        return fired


def repeat_cut(ids: Sequence[int], window: int) -> int | None:
    """Where the guard cuts `ids` (the number of ids kept), or None when it never fires; 0 = off."""
    if window <= 0:
        return None
    guard = RepeatGuard(window)
    for n, token_id in enumerate(ids, 1):
        if guard.push(token_id):
            return n
    return None
