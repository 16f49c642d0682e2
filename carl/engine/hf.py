"""The in-process reference engine: any Hugging Face causal LM (dense or MoE) from a local path.

`HFEngine` implements the engine protocol (`carl.engine.base`): token ids in, sampled ids and
their log-probs out, so trajectories are token-exact. Concurrent `generate` calls from episode
threads are grouped into padded batches by `carl.engine.batching` (continuous batching; see its
docstring for log-prob and seeding semantics). It is the exact reference the vLLM engine is
checked against, and the engine of tests and tiny models; it is slower under agent load
(`benchmarks/engine.py`).

Weights arrive by version from the trainer's weight store (`update_weights(version)`, the same
lossless delta path as the vLLM engine) or directly (`load_state_dict`); an update stops new
requests from starting, waits for the live ones to finish (generations never mix two weight
versions), loads the weights and sets `policy_version`.

Not covered: prompts longer than the model's context window are the caller's problem (the harness keeps
contexts within budget through self-summarisation).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from carl.engine import lora
from carl.engine.base import DefaultSampling, EngineError, EngineStats, SamplingParams, WeightSyncError
from carl.engine.batching import Request, RequestBatcher, RoutingRecorder, SamplerStats, decode_loop
from carl.engine.lora import LoRASpec
from carl.engine.prefix_cache import PrefixCache
from carl.engine.streams import EpisodeStream
from carl.errors import UserError
from carl.harness.policies import Generation
from carl.harness.repetition import RepeatGuard
from carl.systems.delta_sync import bits
from carl.systems.heap import HeapTrimmer
from carl.systems.subscriber import VersionFollower, load_into
from carl.systems.weight_transport import DirectoryTransport

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def auto_dtype(device: str) -> str:
    """The compute dtype "auto" stands for on `device`: "bfloat16" where its matmuls run natively (a
    CUDA GPU with bf16, a CPU with AMX or AVX512-BF16), else "float32". On a CPU without them torch
    falls back to a reference bf16 GEMM: on a 2-core AMD EPYC with AVX2, a 1024x576x1536 matmul ran
    at 1.2 GFLOP/s in bf16 against 46 in fp32 (measured 2026-12-02), and the embedded default's
    warm start ran about 15x slower than on a CPU with AMX."""
    return "bfloat16" if native_bf16(device) else "float32"


def native_bf16(device: str) -> bool:
    """Whether `device` computes bf16 matmuls natively (see `auto_dtype`)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device == "cpu":
        return any(getattr(torch.cpu, probe, lambda: False)()
                   for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    return True  # other accelerators (mps, xpu) compute in bf16


def describe_compute(device: str, dtype: str) -> str:
    """One line on what a run computes with, so that a slow machine says why it is slow: e.g.
    "compute: cpu, 2 threads, float32 (no native bf16 on this CPU: no AMX or AVX512-BF16)"."""
    where = f"cpu, {torch.get_num_threads()} threads" if device == "cpu" else device
    if native_bf16(device):
        return f"compute: {where}, {dtype}"
    why = "no AMX or AVX512-BF16" if device == "cpu" else "no bf16 support"
    return f"compute: {where}, {dtype} (no native bf16 on this {device.split(':')[0].upper()}: {why})"


@dataclass(frozen=True)
class HFEngineConfig:
    path: str
    """Local folder of a Hugging Face causal LM (config.json, weights, tokenizer)."""
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Inference weights dtype; "auto" (`auto_dtype`): bf16 where the device computes it natively,
    else fp32, resolved at construction. bf16 halves memory; decode speed on a CPU with AMX measured
    about equal to fp32 (SmolLM2-135M, 2-16 threads), so pick fp32 on CPU if bit-closeness to an
    fp32 trainer matters."""
    device: str = "cpu"
    """torch device for inference, e.g. "cpu" or "cuda:0"."""
    temperature: float = 1.0
    """Sampling temperature; 0 = greedy. Log-probs are reported at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 keeps the reported log-probs exact for the trainer."""
    max_batch_size: int = 8
    """Most requests decoded together in one padded batch; later ones join as rows finish."""
    batch_wait_s: float = 0.005
    """When idle, how long the batcher waits after a first request so concurrent ones share its prefill."""
    seed: int = 0
    """Seeds the per-request generators (request n uses seed * 1_000_003 + n)."""
    lora: LoRASpec | None = None
    """LoRA runs: the same adapters as the trainer's on the loaded model (the weights it follows
    are the adapters; carl.engine.lora)."""
    attn_implementation: str = "auto"
    """Attention kernel of the sampler: "auto" picks "eager" except on CPU in fp32, where it leaves
    transformers' default ("sdpa"); or any name transformers accepts ("sdpa", "eager"). The sampler's
    batches are left-padded, and "sdpa" with a padding mask is slow on both: on 2 CPU cores in bf16,
    decode of 8 rows x 1500 cached positions ran 1.7x faster with "eager"; on one H200 (gVisor,
    torch 2.11, transformers 5.24), a decode forward of 32 rows x 1500 positions of SmolLM2-135M's
    architecture took 44 ms with "eager", padded or not, against 94-131 ms with "sdpa" and a padding
    mask (benchmarks/sampler.py measures the whole rollout phase)."""
    prefix_cache_tokens: int | None = None
    """Cached positions kept for prefix reuse across turns (`carl.engine.prefix_cache`); 0 turns
    reuse off; None (auto) = 65536 on CPU and off elsewhere. Measured with benchmarks/trainer.py
    part (c), 8 episodes x 4 turns of 128 sampled + 96 observation tokens after 1024-token
    prompts, random SmolLM2-135M weights, bf16: on an H100 reuse ran at 0.98x of full prefill
    (equal decode steps; each prefill 58 ms vs 32 ms: lookup and store cost more than recomputing
    1-2k tokens there; an H200 measured 0.40-0.44x), while on 2 CPU cores it cut prefill from 60%
    of rollout time to 12% (2.3x faster evaluation). Cost per position: 2 x layers x kv_heads x
    head_dim x dtype bytes (SmolLM2-135M in bf16: 23 KB, so 65536 positions take about 1.5 GB).
    Off when a routing recorder is given (router replay needs every prompt position's routing)."""
    heap_trim_s: float = 10.0
    """Hand the heap's free pages back to the OS (glibc `malloc_trim`) at most this often, from the
    batcher when a row finishes; 0 = never. Without it, CPU sampling's allocation churn keeps RSS at
    the largest heap it ever needed (a 16-episode eval sat at 11.2 GB; one trim took it to 4.5 GB).
    Measured with benchmarks/heap_trim.py on 2 CPU cores: RSS after the load x0.71, peak x0.95,
    19 trims in 1.9 s (see `carl.systems.heap`)."""

    def __post_init__(self) -> None:
        if self.dtype == "auto":
            object.__setattr__(self, "dtype", auto_dtype(self.device))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: got {self.dtype!r}, expected 'auto' or one of {sorted(DTYPES)}")
        if self.temperature < 0:
            raise ValueError(f"temperature: got {self.temperature}, expected >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: got {self.top_p}, expected a value in (0, 1]")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: got {self.max_batch_size}, expected >= 1")
        if self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s: got {self.batch_wait_s}, expected >= 0")
        if not self.attn_implementation:
            raise ValueError("attn_implementation: got an empty name, expected 'auto' or a transformers name")
        if self.prefix_cache_tokens is not None and self.prefix_cache_tokens < 0:
            raise ValueError(f"prefix_cache_tokens: got {self.prefix_cache_tokens}, expected >= 0 (0 = off) or None")
        if self.heap_trim_s < 0:
            raise ValueError(f"heap_trim_s: got {self.heap_trim_s}, expected >= 0 (0 = off)")

    def resolved_prefix_cache_tokens(self) -> int:
        """The prefix cache size to use (resolves None: on for CPU, off elsewhere)."""
        if self.prefix_cache_tokens is not None:
            return self.prefix_cache_tokens
        return 65536 if self.device == "cpu" else 0

    def resolved_attn_implementation(self) -> str | None:
        """The `attn_implementation` to load with (None: transformers' default)."""
        if self.attn_implementation != "auto":
            return self.attn_implementation
        return None if self.device == "cpu" and self.dtype == "float32" else "eager"


class HFEngine(DefaultSampling):
    """Batched, seeded sampling from a local HF causal LM in this process; thread-safe `generate`.

    `weights_dir`: the trainer's weight store (`carl.engine.weights.WeightStore`), read by
    `update_weights(version)`; without one, only `load_state_dict` changes the weights."""

    weight_names = "module"

    def __init__(self, config: HFEngineConfig, routing_recorder: RoutingRecorder | None = None,
                 weights_dir: str | Path | None = None):
        self.config = config
        self.tokenizer, self.model = load_model(config.path, DTYPES[config.dtype], config.device,
                                                config.resolved_attn_implementation())
        if config.lora is not None:
            self.model = lora.attach(self.model, config.lora).eval().requires_grad_(False)
        self.policy_version = 0
        self.num_forwards = 0  # model forwards (prefills and decode steps) so far
        self.num_requests = 0
        self.max_live_rows = 0  # the most requests decoded together in one batch so far
        self.sampler_stats = SamplerStats()  # the batcher's time since the last take_stats()
        self.stats = EngineStats()  # what the callers saw (the same measure as every engine's)
        self.routing_recorder = routing_recorder
        super().__init__(SamplingParams(config.temperature, config.top_p))  # `sampling()`: carl.engine.base
        self.follower = VersionFollower(DirectoryTransport(weights_dir)) if weights_dir is not None else None
        self.prefix_cache = PrefixCache(0 if routing_recorder is not None else config.resolved_prefix_cache_tokens())
        self.heap = HeapTrimmer(config.heap_trim_s)
        self._request_ids = itertools.count()
        self._ids_lock = threading.Lock()
        self._weights_lock = threading.Lock()  # held by the decode loop and by weight updates
        self._update_lock = threading.Lock()  # one _between_generations block at a time
        self._batcher = RequestBatcher(self._run, config.batch_wait_s)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int],
                 seed: int | None = None, sampling: SamplingParams | None = None,
                 max_repeat_tokens: int = 0) -> Generation:
        """Sample up to `max_new_tokens` ids after `prompt_ids`, stopping after any id in `stop_ids`.

        `seed` seeds this request's generator; by default it comes from the engine's seed, its weights
        version and the request's arrival number (`episode` gives seeds that do not depend on arrival).
        `sampling` defaults to `default_sampling` (see `sampling()`). `max_repeat_tokens` > 0 stops the
        request as soon as the repetition guard fires (finish_reason "repeat"; carl.harness.repetition)."""
        if not prompt_ids:
            raise ValueError("prompt_ids: expected at least one token, got an empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: got {max_new_tokens}, expected >= 1")
        with self._ids_lock:
            request_id = next(self._request_ids)
        generator = torch.Generator(device=self.config.device)
        if seed is None:  # the weights version is part of the seed: a run resumed at version v never
            # replays the random streams that the requests of version 0 used
            seed = (self.config.seed * 1_000_003 + self.policy_version) * 1_000_033 + request_id
        generator.manual_seed(seed)
        request = Request(request_id, list(prompt_ids), max_new_tokens, frozenset(stop_ids), generator,
                          sampling or self.default_sampling,
                          repeat_guard=RepeatGuard(max_repeat_tokens) if max_repeat_tokens else None)
        with self.stats.request(len(prompt_ids)) as generated:
            gen = self._batcher.submit(request)
            generated.append(len(gen.token_ids))
        return gen

    def episode(self, key: str) -> EpisodeStream:
        """A view of this engine for one episode whose turns sample from streams named by (seed, `key`,
        turn), not by arrival order (`carl.engine.streams`)."""
        return EpisodeStream(self, self.config.seed, key)

    def update_weights(self, version: int) -> dict[str, Any]:
        """Load `version` from the weight store between batches (see `Engine.update_weights`)."""
        if self.follower is None:
            raise WeightSyncError("update_weights: this engine has no weights_dir to read versions from")
        t0 = time.perf_counter()
        changed = self.follower.advance(version)
        if self.follower.version != version:
            raise WeightSyncError(f"weights version {version} cannot be loaded (engine stays at "
                                  f"{self.follower.version}): {self.follower.last_error}")
        t1 = time.perf_counter()
        state = self.follower.state
        with self._between_generations():
            if changed:
                # LoRA: the adapters are what is published
                params = lora.adapter_params(self.model) if self.config.lora is not None else None
                load_into(self.model, state, changed, params)
                self.prefix_cache.clear()  # states computed with the old weights
            self.policy_version = version
        t2 = time.perf_counter()
        return {"crc32": tensor_crcs(state, changed), "decode_s": t1 - t0, "load_s": t2 - t1,
                "crc_s": time.perf_counter() - t2, "tensors_changed": len(changed)}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Load a state dict directly (tests, benchmarks); returns the new version (by default +1)."""
        with self._between_generations():
            self.model.load_state_dict(dict(state_dict), strict=True)
            self.prefix_cache.clear()  # states computed with the old weights
            self.policy_version = self.policy_version + 1 if version is None else version
            return self.policy_version

    def take_stats(self) -> SamplerStats:
        """The sampler's time split (prefill, decode, merge) since the last call, and start afresh."""
        with self._between_generations():
            stats, self.sampler_stats = self.sampler_stats, SamplerStats()
        return stats

    def take_metrics(self) -> dict[str, float]:
        """`engine/*` metrics since the last call (as every engine's) and the batcher's `sampler/*`."""
        engine = self.stats.take()
        return engine | self.take_stats().metrics(engine["engine/wall_s"])

    def health(self) -> None:
        if self._batcher.closed:
            raise EngineError("the engine was closed")

    def close(self) -> None:
        """Stop the batcher thread (pending calls finish first)."""
        self._batcher.close()

    @contextlib.contextmanager
    def _between_generations(self):
        """Hold the decode loop still: live rows finish, no new ones start until the block ends."""
        with self._update_lock:
            self._batcher.paused.set()
            try:
                with self._weights_lock:
                    yield
            finally:
                self._batcher.paused.clear()

    def _run(self, admit, deliver) -> None:
        live = 0

        def admit_counted(n: int) -> list[Request]:
            nonlocal live
            requests = admit(n)
            for r in requests:
                r.version = self.policy_version
            self.num_requests += len(requests)
            live += len(requests)
            self.max_live_rows = max(self.max_live_rows, live)
            return requests

        def deliver_counted(request: Request) -> None:
            nonlocal live
            live -= 1
            deliver(request)
            self.heap.maybe_trim()

        with self._weights_lock:
            self.num_forwards += decode_loop(
                self.model,
                admit_counted,
                deliver_counted,
                self.config.max_batch_size,
                self.routing_recorder,
                self.prefix_cache,
                self.sampler_stats,
            )


def tensor_crcs(state: Mapping[str, torch.Tensor], names: set[str]) -> dict[str, int]:
    """CRC-32 of the bits of each tensor in `names` (the engine side of a weight sync's check)."""
    return {name: zlib.crc32(bits(state[name]).cpu().numpy()) for name in sorted(names)}


def load_model(path: str | Path, dtype: torch.dtype, device: str = "cpu",
               attn_implementation: str | None = None) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode with gradients off) from a local HF folder, or from a LoRA
    adapter folder (its base with the adapter merged; carl.engine.lora); UserError if it is neither.
    `attn_implementation` ("sdpa", "eager", ...) overrides transformers' default."""
    folder = Path(path)
    from carl.engine.lora import adapter_base, is_adapter

    if is_adapter(folder):  # a LoRA run's checkpoint: its base model with the adapter merged in
        from peft import PeftModel

        base_path = adapter_base(folder)
        tokenizer, base = load_model(base_path, dtype, device, attn_implementation)
        model = PeftModel.from_pretrained(base, folder).merge_and_unload()
        model.requires_grad_(False)
        if (folder / "tokenizer_config.json").is_file():  # a checkpoint saves the run's tokenizer beside it
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(folder)
        return tokenizer, model
    if not (folder / "config.json").is_file():
        raise UserError(
            f"model path {str(folder)!r} is not a Hugging Face model folder (no config.json); "
            "expected a local folder saved with save_pretrained"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **extra).to(device)
    model.eval()
    model.requires_grad_(False)
    return tokenizer, model


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its eos id (pads are masked out, so any id works)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0

