"""Which inference engine serves the rollouts, and how (the `engine.*` settings of a run)."""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "hf")


@dataclass(frozen=True)
class EngineConfig:
    kind: str = "vllm"
    """"vllm": a vLLM server (carl starts one from its own venv, or uses `url`); "hf": the
    in-process transformers sampler (the exact reference: tests, tiny models, no vLLM)."""
    url: str = ""
    """An already running server started with `carl engine serve` (e.g. http://10.0.0.5:8011);
    empty: carl starts and stops its own. It must read this run's weights directory."""
    max_model_len: int = 0
    """The server's context length; 0 = the run's limits.context_budget_tokens."""
    port: int = 0
    """Port of the server carl starts; 0 = a free one."""
    enforce_eager: bool = True
    """Skip vLLM's graph compilation. On the 2-core CPU, compiling cost 87-110 s at every start for
    61 vs 50 tokens/s eager (measured for the engine issue); on a 2-core AVX2 CPU (fp32) 8.2 vs 7.5
    tokens/s for 110 s more start-up (docs/engine.md); on GPUs set false (CUDA graphs)."""
    kv_cache_gb: int = 2
    """CPU: GiB for vLLM's KV cache, a whole number (SmolLM2-135M: 93k cached tokens in 2 GiB)."""
    gpu_memory_utilization: float = 0.5
    """GPU: the share of the device vLLM may take; the trainer needs the rest on a shared device."""
    cpu_threads: int = 0
    """CPU: the worker's OpenMP threads (0 = one per core; vLLM keeps one core for its scheduler
    except on machines of at most 4 cores, carl.engine.vllm_server.cpu_binding)."""
    start_timeout_s: float = 900.0
    """Most seconds to wait for a starting server's /health (model load, compilation, warm-up)."""
    max_restarts: int = 2
    """How often a server that died is started again before the run stops."""
    request_timeout_s: float = 1800.0
    """Most seconds one generate request may take."""
    snapshot_every: int = 10
    """Weight sync: a full snapshot every N versions, deltas between (carl.systems.delta_sync)."""
    block_size: int = 0
    """Tokens per KV-cache block of a server carl starts; 0: 32 on a CPU (vLLM's CPU default, 128,
    computes each turn's context again past its last full block: evals of the embedded default took
    1.11x as long, carl.engine.vllm_server.CPU_BLOCK_SIZE), vLLM's own choice on a GPU."""

    def __post_init__(self) -> None:
        if self.kind not in ENGINES:
            raise ValueError(f"engine.kind: got {self.kind!r}, expected one of {list(ENGINES)}")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine.url: got {self.url!r}, expected an http(s) URL such as http://127.0.0.1:8011")
        for name in ("max_model_len", "port", "cpu_threads", "max_restarts", "block_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"engine.{name}: got {getattr(self, name)}, expected >= 0")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"engine.port: got {self.port}, expected 0..65535 (0 = a free port)")
        if not isinstance(self.kv_cache_gb, int) or self.kv_cache_gb < 1:
            raise ValueError(f"engine.kv_cache_gb: got {self.kv_cache_gb!r}, expected a whole number of GiB >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"engine.gpu_memory_utilization: got {self.gpu_memory_utilization}, expected in (0, 1]")
        for name in ("start_timeout_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"engine.{name}: got {getattr(self, name)}, expected > 0")
        if self.snapshot_every < 1:
            raise ValueError(f"engine.snapshot_every: got {self.snapshot_every}, expected >= 1")
