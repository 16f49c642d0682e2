"""Continuous batched sampling for a token-level policy: the decode loop and the request queue.

Several agent episodes call `generate` from their own threads. Each call becomes a `Request` in
a queue. One batcher thread runs `decode_loop`: it keeps a left-padded batch of live rows with
a shared KV cache and, before every decode step, admits waiting requests (up to
`max_batch_size` rows): each is prefilled from the longest prefix whose KV states the
`PrefixCache` holds (the previous turn of the same episode, or the shared system prompt) and
merged into the live batch (caches and attention masks left-padded to a common length). Each row
stops on its own stop ids, token budget or repetition guard (`carl.harness.repetition`), leaves
the batch at once (its cache row goes to the prefix cache) and its caller wakes up, so an episode
can run its tools while the others keep generating.

    episode threads                       batcher thread (decode_loop)
    generate() ──┐                  ┌─> admit: prefill new requests past their cached prefix,
    generate() ──┼──> queue ──> ────┤          merge into the live batch
    generate() ──┘   (wait)         ├─> decode one token for every live row
                                    └─> finished rows: cache row -> prefix cache,
                                        result -> Event.set() -> caller returns

The loop holds the policy's weights lock while any row is live; a weight update asks it to stop
admitting (`paused`), the live rows finish, and the new weights load before the next admission,
so one generation never mixes two weight versions.

Shapes: B = live rows, S = cached positions (left-padded), L = prompt length, T = tokens fed
in one forward, V = vocabulary.

Log-probs: each sampled id comes with the log-prob of the distribution it was drawn from:
log softmax(logits / temperature), truncated to the top-p nucleus and renormalised when
top_p < 1 (vLLM's `processed_logprobs`, so both engines report the same quantity). With top_p = 1
(the RL default) that is exactly what the trainer recomputes (`carl.rl.logprobs.sequence_logprobs`
at the same temperature). Temperature 0 means greedy decoding, reported at temperature 1.
Sampling parameters are per request (`Request.sampling`): rows of one batch may differ.

Randomness: every request carries its own `torch.Generator` (seeded by the policy from its seed
and the request's arrival number), so a request's samples do not depend on which other requests
share its batch, and sequential calls under the same seed repeat exactly. Batch composition can
still change logits in the last bits (padding changes matmul shapes).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from carl.engine.base import SamplingParams
from carl.harness.policies import Generation
from carl.harness.repetition import RepeatGuard
from carl.engine.prefix_cache import KV, PrefixCache


class RoutingRecorder(Protocol):
    """Hook for MoE router replay (see carl.systems.router_replay); integration comes later.

    When a recorder is given, every forward runs with `output_router_logits=True` and the
    recorder sees each forward's router logits with the request ids of its rows (a prefill
    covers the padded prompts, a decode step one token per row); `pop` returns the record
    stored in `Generation.routing` when a request finishes.
    """

    def record(
        self, request_ids: Sequence[int], attention_mask_B_T: torch.Tensor, router_logits: Any
    ) -> None: ...

    def pop(self, request_id: int) -> Any: ...


@dataclass
class Request:
    """One `generate` call: its inputs, the tokens sampled so far, and how its caller is woken."""

    request_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    generator: torch.Generator
    sampling: SamplingParams
    version: int = 0  # the weights version that decodes it (the loop holds the weights still)
    repeat_guard: RepeatGuard | None = None  # stops the row when it fires (carl.harness.repetition)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


@dataclass
class LiveBatch:
    """The rows being decoded: each row's cache, mask, next input id and its position."""

    rows: list[Request]
    cache: Any  # transformers DynamicCache, [B, heads, S, head_dim] per layer
    attn_B_S: torch.Tensor  # 1 where the cache holds a real token
    next_B: torch.Tensor  # the id each row feeds next (sampled, not yet in the cache)
    pos_B: torch.Tensor  # the position id of next_B


@dataclass
class SamplerStats:
    """Where the batcher thread's time went (wall seconds), summed until the policy's `take_stats()`.

    Every forward ends by sampling, whose `.tolist()` waits for the device, so the times include
    GPU work. Against the wall time of a rollout phase they say whether it waited on the sampler
    (busy fraction near 1) or on the episodes' tools (near 0)."""

    prefills: int = 0
    prefill_tokens: int = 0  # prompt positions computed, past the reused prefix
    prefill_s: float = 0.0
    decode_steps: int = 0
    decode_rows: int = 0  # rows summed over decode steps: their mean batch is decode_rows / decode_steps
    decode_s: float = 0.0
    merge_s: float = 0.0

    def metrics(self, wall_s: float) -> dict[str, float]:
        """`sampler/*` metrics of a phase that took `wall_s` seconds."""
        busy = self.prefill_s + self.decode_s + self.merge_s
        return {
            "sampler/busy_frac": busy / wall_s if wall_s > 0 else 0.0,
            "sampler/prefill_s": self.prefill_s,
            "sampler/prefill_tokens_per_s": self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0,
            "sampler/decode_s": self.decode_s,
            "sampler/decode_ms_per_step": 1000 * self.decode_s / max(self.decode_steps, 1),
            "sampler/rows_per_decode_step": self.decode_rows / max(self.decode_steps, 1),
            "sampler/merge_s": self.merge_s,
        }


def decode_loop(
    model: Any,
    admit: Callable[[int], list[Request]],
    deliver: Callable[[Request], None],
    max_rows: int,
    recorder: RoutingRecorder | None = None,
    prefix_cache: PrefixCache | None = None,
    stats: SamplerStats | None = None,
) -> int:
    """Decode until no row is live and `admit` has nothing more; returns the number of forwards.

    `admit(n)` returns up to n waiting requests (non-blocking); `deliver(request)` is called
    once per request when it finishes, with `request.result` set. With a `prefix_cache`, prompts
    start from the longest stored prefix and finished rows are stored for the next turn. `stats`
    accumulates the time spent in prefills, decode steps and merges.
    """
    prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(max_tokens=0)
    stats = stats if stats is not None else SamplerStats()
    batch: LiveBatch | None = None
    num_forwards = 0
    with torch.inference_mode():
        while True:
            new = admit(max_rows - (len(batch.rows) if batch else 0))
            if batch is None and not new:
                return num_forwards
            if batch is not None:
                t0, rows = time.perf_counter(), len(batch.rows)
                batch = decode_step(model, batch, deliver, recorder, prefix_cache)
                stats.decode_s += time.perf_counter() - t0
                stats.decode_steps, stats.decode_rows = stats.decode_steps + 1, stats.decode_rows + rows
                num_forwards += 1
            for request in new:
                t0, reused = time.perf_counter(), prefix_cache.reused_tokens
                fresh = prefill(model, request, deliver, recorder, prefix_cache)
                t1 = time.perf_counter()
                batch = merge(batch, fresh)
                stats.prefill_s, stats.merge_s = stats.prefill_s + t1 - t0, stats.merge_s + time.perf_counter() - t1
                stats.prefills += 1
                stats.prefill_tokens += len(request.prompt_ids) - (prefix_cache.reused_tokens - reused)
                num_forwards += 1


def prefill(
    model: Any,
    request: Request,
    deliver: Callable[[Request], None],
    recorder: RoutingRecorder | None,
    prefix_cache: PrefixCache,
) -> LiveBatch | None:
    """Run one prompt (from its longest stored prefix on), sample its first token.

    One request per forward: with prefix reuse most of a prompt is already cached, and the
    uncached suffixes of different requests have different lengths, so padding them into one
    batch would mostly compute padding.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    L = len(request.prompt_ids)
    n, kv = prefix_cache.match(request.prompt_ids)
    cache = DynamicCache(ddp_cache_data=kv) if kv is not None else DynamicCache()
    ids_1_T = torch.tensor([request.prompt_ids[n:]], dtype=torch.long, device=device)
    attn_1_L = torch.ones((1, L), dtype=torch.long, device=device)
    pos_1_T = torch.arange(n, L, device=device)[None]
    logits_1_V = _forward(model, [request], ids_1_T, attn_1_L, pos_1_T, cache, recorder)
    if cache.get_seq_length() != L:
        # an older transformers ignores the `cache=` keyword (it was `past_key_values`) and
        # would silently decode without context
        raise RuntimeError("the model did not fill the KV cache: carl needs transformers >= 5.24")
    prefix_cache.store(request.prompt_ids, _row_kv(cache, 0, L))
    batch = LiveBatch([request], cache, attn_1_L, pos_1_T[:, -1], pos_1_T[:, -1] + 1)
    return _sample_and_retire(batch, logits_1_V, deliver, recorder, prefix_cache)


def decode_step(
    model: Any,
    batch: LiveBatch,
    deliver: Callable[[Request], None],
    recorder: RoutingRecorder | None,
    prefix_cache: PrefixCache,
) -> LiveBatch | None:
    """Feed every row its next id, sample the one after it."""
    batch.attn_B_S = torch.cat([batch.attn_B_S, batch.attn_B_S.new_ones((len(batch.rows), 1))], dim=1)
    logits_B_V = _forward(
        model, batch.rows, batch.next_B[:, None], batch.attn_B_S, batch.pos_B[:, None], batch.cache, recorder
    )
    batch.pos_B = batch.pos_B + 1
    return _sample_and_retire(batch, logits_B_V, deliver, recorder, prefix_cache)


def _forward(model, rows, ids_B_T, attn_B_S, pos_B_T, cache, recorder) -> torch.Tensor:
    out = model(
        input_ids=ids_B_T,
        attention_mask=attn_B_S,
        position_ids=pos_B_T,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
        **({"output_router_logits": True} if recorder is not None else {}),
    )
    if recorder is not None:
        recorder.record([r.request_id for r in rows], attn_B_S, out.router_logits)
    return out.logits[:, -1, :]


def _sample_and_retire(
    batch: LiveBatch,
    logits_B_V: torch.Tensor,
    deliver: Callable[[Request], None],
    recorder: RoutingRecorder | None,
    prefix_cache: PrefixCache,
) -> LiveBatch | None:
    """Sample one id per row; deliver the rows that finished (storing their cache rows for the
    next turn) and drop them from the batch."""
    next_B, logprob_B = sample_tokens(logits_B_V, [r.generator for r in batch.rows], [r.sampling for r in batch.rows])
    keep = []
    for j, (r, tok, lp) in enumerate(zip(batch.rows, next_B.tolist(), logprob_B.tolist(), strict=True)):
        r.token_ids.append(tok)
        r.logprobs.append(lp)
        stop = tok in r.stop_ids
        repeated = not stop and r.repeat_guard is not None and r.repeat_guard.push(tok)
        if stop or repeated or len(r.token_ids) >= r.max_new_tokens:
            r.finish_reason = "stop" if stop else "repeat" if repeated else "length"
            if prefix_cache.max_tokens:
                fed = r.prompt_ids + r.token_ids[:-1]  # the last sampled id was never fed
                prefix_cache.store(fed, _row_kv(batch.cache, j, len(fed)))
            routing = recorder.pop(r.request_id) if recorder is not None else None
            r.result = Generation(r.token_ids, r.logprobs, r.finish_reason, routing,  # type: ignore[arg-type]
                                  versions=((r.version, len(r.token_ids)),))
            deliver(r)
        else:
            keep.append(j)
    if not keep:
        return None
    batch.next_B = next_B
    if len(keep) < len(batch.rows):
        keep_B = torch.tensor(keep, dtype=torch.long, device=next_B.device)
        batch.cache.batch_select_indices(keep_B)
        batch.rows = [batch.rows[j] for j in keep]
        batch.attn_B_S, batch.next_B, batch.pos_B = (
            batch.attn_B_S[keep_B],
            next_B[keep_B],
            batch.pos_B[keep_B],
        )
    return batch


def _row_kv(cache: Any, row: int, length: int) -> KV:
    """Row `row`'s last `length` cached positions, per layer (rows are left-padded: real tokens are last)."""
    return [(layer.keys[row : row + 1, :, -length:], layer.values[row : row + 1, :, -length:]) for layer in cache.layers]


def merge(a: LiveBatch | None, b: LiveBatch | None) -> LiveBatch | None:
    """One batch holding the rows of both, caches and masks left-padded to a common length."""
    if a is None or b is None:
        return a if b is None else b
    from transformers.cache_utils import DynamicLayer

    S = max(a.attn_B_S.shape[1], b.attn_B_S.shape[1])
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        if type(la) is not DynamicLayer or type(lb) is not DynamicLayer:
            raise TypeError(
                f"cannot merge KV cache layers of type {type(la).__name__}; expected DynamicLayer"
            )
        la.keys = torch.cat([_left_pad(la.keys, S, dim=2), _left_pad(lb.keys, S, dim=2)])
        la.values = torch.cat([_left_pad(la.values, S, dim=2), _left_pad(lb.values, S, dim=2)])
    a.attn_B_S = torch.cat([_left_pad(a.attn_B_S, S, dim=1), _left_pad(b.attn_B_S, S, dim=1)])
    a.rows = a.rows + b.rows
    a.next_B = torch.cat([a.next_B, b.next_B])
    a.pos_B = torch.cat([a.pos_B, b.pos_B])
    return a


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim) + [missing, 0]  # F.pad lists dims from the last one
    return F.pad(x, pad)


def sample_tokens(
    logits_B_V: torch.Tensor, generators: Sequence[torch.Generator], sampling_B: Sequence[SamplingParams]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sampled id per row (row i uses generators[i] and sampling_B[i]) and its log-prob (see
    module docstring). Greedy rows (temperature 0) draw nothing from their generator."""
    logits_B_V = logits_B_V.float()
    greedy_B = torch.tensor([p.temperature == 0 for p in sampling_B], device=logits_B_V.device)
    temp_B = torch.tensor([p.temperature or 1.0 for p in sampling_B], device=logits_B_V.device)
    logprobs_B_V = torch.log_softmax(logits_B_V / temp_B[:, None], dim=-1)
    top_p_B = torch.tensor([p.top_p for p in sampling_B], device=logits_B_V.device)
    if bool((top_p_B < 1).any()):
        probs_B_V = top_p_filter(logprobs_B_V.exp(), top_p_B[:, None])
        logprobs_B_V = torch.log(probs_B_V / probs_B_V.sum(-1, keepdim=True))  # the distribution drawn from
    if bool(greedy_B.all()):
        next_B = logits_B_V.argmax(-1)
        return next_B, logprobs_B_V.gather(-1, next_B[:, None])[:, 0]
    # inverse-CDF sampling: one uniform draw per row from the row's own generator, then one batched
    # search (per-row torch.multinomial calls cost ~1 ms a row on CPU over SmolLM2's 49k vocabulary)
    u_B = torch.stack([
        torch.zeros((), dtype=torch.float64, device=g.device) if p.temperature == 0
        else torch.rand((), generator=g, device=g.device, dtype=torch.float64)
        for g, p in zip(generators, sampling_B, strict=True)
    ])
    cdf_B_V = logprobs_B_V.exp().double().cumsum(-1)
    # side="right": the first id whose cumulative mass exceeds the draw, so a zero-probability id
    # (a flat step of the cdf) is never picked, not even for a draw of exactly 0
    next_B = torch.searchsorted(cdf_B_V, (u_B.to(cdf_B_V.device) * cdf_B_V[:, -1])[:, None], right=True)[:, 0]
    next_B = next_B.clamp_max(logits_B_V.shape[-1] - 1)  # a draw at the very top after rounding
    next_B = torch.where(greedy_B, logits_B_V.argmax(-1), next_B)
    return next_B, logprobs_B_V.gather(-1, next_B[:, None])[:, 0]


def top_p_filter(probs_B_V: torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """Zero every token outside the smallest set whose mass reaches `top_p` (the top token stays);
    `top_p` is one value or a [B, 1] column of per-row values."""
    sorted_B_V, order_B_V = probs_B_V.sort(dim=-1, descending=True)
    mass_before_B_V = sorted_B_V.cumsum(-1) - sorted_B_V  # mass of strictly more likely tokens
    sorted_B_V = sorted_B_V.masked_fill(mass_before_B_V >= top_p, 0.0)
    return torch.zeros_like(probs_B_V).scatter(-1, order_B_V, sorted_B_V)


class RequestBatcher:
    """Owns the queue and the batcher thread, which calls `run(admit, deliver)` when work arrives.

    `run` must call `admit(n)` until it returns nothing and `deliver(request)` for each finished
    request; if `run` raises, every admitted request not yet delivered gets the error.
    """

    def __init__(self, run: Callable[..., Any], wait_s: float):
        self._run = run
        self._wait_s = wait_s
        self._queue: queue.Queue[Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = False  # the close sentinel was seen: admit nothing more
        self.paused = threading.Event()  # set: admit nothing new (a weight update is waiting)

    def submit(self, request: Request) -> Generation:
        """Queue `request`, block until it has been decoded, return its Generation (or raise)."""
        with self._lock:  # put under the lock: nothing may follow close()'s sentinel
            if self._closed:
                raise RuntimeError("the engine was closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="carl-engine-batcher", daemon=True)
                self._thread.start()
            self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the thread after the queued requests are done."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _loop(self) -> None:
        while not self._stopping:
            first = self._queue.get()  # block until there is work
            if first is None:
                return
            time.sleep(self._wait_s)  # let concurrent callers join the first prefill
            self._serve(first)

    def _serve(self, first: Request) -> None:
        waiting = [first]
        live: list[Request] = []

        def admit(n: int) -> list[Request]:
            taken = waiting[:n]
            del waiting[:n]
            while len(taken) < n and not self.paused.is_set() and not self._stopping:
                try:
                    r = self._queue.get_nowait()
                except queue.Empty:
                    break
                if r is None:
                    self._stopping = True
                else:
                    taken.append(r)
            live.extend(taken)
            return taken

        def deliver(r: Request) -> None:
            live.remove(r)
            r.done.set()

        try:
            self._run(admit, deliver)
        except BaseException as e:  # noqa: BLE001 -- handed to the callers, who re-raise it
            for r in live + waiting:
                r.error = e
                r.done.set()
