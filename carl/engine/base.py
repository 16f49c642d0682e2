"""The inference engine protocol: token ids in, sampled ids and their log-probs out, weights by version.

    trainer --WeightStore.publish(model, v)--> weights dir (lossless delta blobs, carl.systems.delta_sync)
       |                                             |
       +--engine.update_weights(v)--> engine: follows the dir to v, loads, returns its checksums
                                             ^
    rollout workers --generate(prompt ids, sampling, seed)--+--> Generation(ids, log-probs, versions)

Every engine speaks this protocol (`TokenPolicy` of the harness, plus weights and lifecycle):

- `HFEngine` (carl.engine.hf): the in-process transformers sampler, the exact reference kept for
  tests and tiny models;
- `VLLMEngine` (carl.engine.vllm): a vLLM server (started and watched by carl, or one the user
  runs), the default for training wherever vLLM runs.

`OpenAIChatPolicy` (carl.engine.openai_client) is the chat-level client for production use and
evaluation against any endpoint: text in, text out, no token ids and no weights.

Log-probs: each sampled id comes with log softmax(logits / temperature) at that id after
top-p truncation and renormalisation (the distribution it was drawn from); with top_p = 1, the
RL default, that is exactly what the trainer recomputes (`carl.rl.logprobs`). Temperature 0 is
greedy decoding, reported at temperature 1.

Seeds: `generate(..., seed=s)` draws the request's random numbers from a generator seeded with s
alone, so a request samples the same tokens whichever other requests share its batch (up to
last-bit differences of batched matmuls), and `episode(key)` gives seeds named by the episode,
not by arrival order (`carl.engine.streams`): evaluations repeat, and two checkpoints evaluated
with one seed are compared on common random numbers.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from carl.harness.policies import Generation


class EngineError(RuntimeError):
    """The engine failed or cannot be started; the message says what to do."""


class WeightSyncError(EngineError):
    """A weights version did not reach the engine intact (the message names the version and tensor)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """Sampling temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature: got {self.temperature}, expected >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: got {self.top_p}, expected a value in (0, 1]")


@runtime_checkable
class Engine(Protocol):
    tokenizer: Any
    """The Hugging Face tokenizer whose chat template frames the conversation."""
    weight_names: Literal["module", "checkpoint"]
    """How the published weights must name tensors: as the trainer's module does ("module"), or as
    the model's checkpoint files do ("checkpoint": vLLM's loader; transformers fuses some tensors)."""

    @property
    def policy_version(self) -> int:
        """The weights version new requests are sampled with."""
        ...

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int],
                 seed: int | None = None, sampling: SamplingParams | None = None,
                 max_repeat_tokens: int = 0) -> Generation:
        """Sample up to `max_new_tokens` ids after `prompt_ids`, stopping after any of `stop_ids`;
        `sampling` defaults to the engine's current default (see `sampling()`); `max_repeat_tokens`
        > 0: the repetition guard (carl.harness.repetition), which an engine may apply early or
        leave to the harness's cut. Thread-safe."""
        ...

    def episode(self, key: str) -> Any:
        """One episode's view whose turns sample from seeds named by (engine seed, key, turn)."""
        ...

    def sampling(self, temperature: float, top_p: float | None = None) -> contextlib.AbstractContextManager:
        """Within the block, requests without their own `sampling` use these parameters."""
        ...

    def update_weights(self, version: int) -> dict[str, Any]:
        """Load `version` from the engine's weight store; returns {"crc32": {name: crc} of the
        tensors it changed, computed engine-side, plus timing metrics}. WeightSyncError when the
        version cannot be loaded intact."""
        ...

    def take_metrics(self) -> dict[str, float]:
        """`engine/*` metrics (requests, tokens/s, busy fraction, latency) since the last call."""
        ...

    def health(self) -> None:
        """Return when the engine serves; raise EngineError saying why not."""
        ...

    def close(self) -> None:
        """Stop serving and free what the engine holds (its server process, threads)."""
        ...


class DefaultSampling:
    """`sampling()` for engines whose requests each carry their parameters: a default that
    requests already submitted do not see change."""

    def __init__(self, sampling: SamplingParams):
        self.default_sampling = sampling

    @contextlib.contextmanager
    def sampling(self, temperature: float, top_p: float | None = None) -> Iterator[Any]:
        previous = self.default_sampling
        self.default_sampling = SamplingParams(temperature, previous.top_p if top_p is None else top_p)
        try:
            yield self
        finally:
            self.default_sampling = previous


class EngineStats:
    """What the engine's callers saw since the last `take()`: requests, generated tokens, latency,
    and the time at least one request was in flight (the engine's busy time as its callers see it;
    the same measure for every engine). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.requests = self.generated_tokens = self.prompt_tokens = 0
        self.latencies_s: list[float] = []
        self.busy_s = 0.0
        self._t0 = now
        self._in_flight, self._busy_since = 0, now

    @contextlib.contextmanager
    def request(self, prompt_tokens: int) -> Iterator[list[int]]:
        """Around one request; the caller appends its generated token count to the yielded list."""
        out: list[int] = []
        t0 = time.monotonic()
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = t0
            self._in_flight += 1
        try:
            yield out
        finally:
            t1 = time.monotonic()
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.busy_s += t1 - self._busy_since
                self.requests += 1
                self.prompt_tokens += prompt_tokens
                self.generated_tokens += sum(out)
                self.latencies_s.append(t1 - t0)

    def take(self) -> dict[str, float]:
        """`engine/*` metrics since the last call (busy time counted up to now), and start afresh."""
        now = time.monotonic()
        with self._lock:
            busy = self.busy_s + (now - self._busy_since if self._in_flight else 0.0)
            wall = now - self._t0
            lat = sorted(self.latencies_s)
            m = {
                "engine/wall_s": wall,
                "engine/requests": float(self.requests),
                "engine/generated_tokens": float(self.generated_tokens),
                "engine/gen_tokens_per_s": self.generated_tokens / wall if wall > 0 else 0.0,
                "engine/busy_frac": busy / wall if wall > 0 else 0.0,
                "engine/latency_p50_s": _quantile(lat, 0.5),
                "engine/latency_p90_s": _quantile(lat, 0.9),
            }
            in_flight = self._in_flight
            self._reset(now)
            self._in_flight = in_flight  # requests still running count from now on
        return m


def _quantile(sorted_xs: list[float], q: float) -> float:
    if not sorted_xs:
        return 0.0
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]
