"""A vLLM server as a process carl starts, watches and always stops.

    VLLMServer.start():  vLLM's venv (carl.engine.vllm_env) -> python -m vllm.entrypoints.openai.api_server
                         in its own process group, log to <run dir>/engine/vllm.log, carl's source on
                         PYTHONPATH for the worker extension -> wait for /health
    alive() / restart(): the engine client restarts a server that died (at most `max_restarts`)
    stop():              SIGTERM to the group, SIGKILL after a grace period

Never left running: the server's group is stopped by `stop()`, at interpreter exit (atexit) and
on SIGTERM/SIGINT of carl; if carl is SIGKILLed the kernel sends the server SIGTERM
(PR_SET_PDEATHSIG) and vLLM takes its engine and worker processes down with it.

Settings that carl relies on:
- `--no-enable-chunked-prefill` with `--max-num-batched-tokens >= --max-model-len`: vLLM rewinds
  a seeded request's generator after a partial prefill, which CPU generators cannot do ("CPU
  Generator does not use offset" kills the engine), so no prefill is ever split;
- `--logprobs-mode processed_logprobs`: the log-prob of the distribution sampled from
  (temperature and top-p applied), what carl's trainer recomputes (carl.engine.base);
- `VLLM_SERVER_DEV_MODE=1` and `--enable-scale-out`: the `/collective_rpc`, pause and
  token-in/token-out `/inference/v1/generate` endpoints. They are unauthenticated, so the server
  listens on 127.0.0.1 only unless told otherwise.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from carl.engine.base import EngineError
from carl.engine.vllm_env import has_cuda, vllm_python

CARL_SRC = Path(__file__).resolve().parents[2]  # the folder holding the `carl` package
WORKER_EXTENSION = "carl.engine.vllm_worker.CarlWorkerExtension"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ServerSpec:
    """How to start one vLLM server for one model."""

    model: str
    """Local Hugging Face model folder."""
    dtype: str = "bfloat16"
    max_model_len: int = 4096
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port chosen at start."""
    enforce_eager: bool = True
    kv_cache_gb: int = 2
    """CPU: GiB of the KV cache (VLLM_CPU_KVCACHE_SPACE, a whole number)."""
    gpu_memory_utilization: float = 0.5
    """GPU: the fraction of the device's memory vLLM may take (weights, KV cache)."""
    cpu_threads: int = 0
    """CPU: OpenMP threads of the worker (0: `cpu_binding`'s choice)."""
    seed: int = 0
    record_routes: bool = False
    """MoE router replay: no prefix caching (every position computed, so every position has its
    routes) and, on GPU, no CUDA graphs (the worker's capture runs on the host each forward)."""
    lora_rank: int = 0
    """LoRA runs: the adapters' rank (> 0 serves one run-time adapter, carl.engine.lora)."""
    block_size: int = 0
    """Tokens per KV-cache block; 0: CPU_BLOCK_SIZE on a CPU, vLLM's own choice on a GPU."""
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, python: Path, port: int) -> list[str]:
        args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", "carl", "--dtype", self.dtype, "--host", self.host,
                "--port", str(port), "--max-model-len", str(self.max_model_len),
                "--max-num-batched-tokens", str(max(self.max_model_len, 2048)),
                "--no-enable-chunked-prefill", "--logprobs-mode", "processed_logprobs",
                "--enable-scale-out", "--worker-extension-cls", WORKER_EXTENSION,
                "--seed", str(self.seed), "--disable-uvicorn-access-log"]
        if self.enforce_eager or self.record_routes:
            args.append("--enforce-eager")
        if self.record_routes:
            args.append("--no-enable-prefix-caching")
        if self.lora_rank:  # vLLM takes max ranks from a fixed set: the smallest that holds ours
            rank = min(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= self.lora_rank)
            args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1"]
        if has_cuda():
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.block_size or not has_cuda():
            args += ["--block-size", str(self.block_size or CPU_BLOCK_SIZE)]
        return args + list(self.extra_args)


SMALL_MACHINE_CPUS = 4

CPU_BLOCK_SIZE = 32
"""KV-cache block of a CPU server, in tokens. The prefix cache keeps whole blocks only, so each turn
of an episode computes again the part of its context past the last full block: half a block on
average, per request. vLLM's CPU default is 128; at 32 (the smallest its CPU attention takes: 16
stops the worker) a held-out eval of the embedded default computed 21% fewer prompt tokens and
took 10% less time, every sample the same (docs/engine.md, "KV-cache blocks")."""


def check_block_size(block_size: int) -> None:
    """EngineError for a KV-cache block vLLM would refuse on this machine (on a CPU its worker dies
    after loading the model, so say it before): CPU attention takes multiples of CPU_BLOCK_SIZE."""
    if block_size % CPU_BLOCK_SIZE and not has_cuda():
        raise EngineError(f"engine.block_size: got {block_size}, expected a multiple of {CPU_BLOCK_SIZE} on a CPU "
                          f"(vLLM's CPU attention kernels), or 0 for {CPU_BLOCK_SIZE}")


def cpu_binding(cpu_threads: int, cpus: int) -> dict[str, str]:
    """The environment that sets a CPU server's worker threads: `cpu_threads` > 0 binds cores
    0..cpu_threads-1. With 0, vLLM binds one thread per core but keeps a core for its scheduler
    process; on a machine of at most SMALL_MACHINE_CPUS cores that is a quarter to a half of its
    compute, and the scheduler's work is light, so carl gives that core to the worker too
    (measured on 2 cores: the default's warm-start eval 133 s with one worker thread, 109 s with
    two). Bigger machines keep vLLM's choice."""
    if cpu_threads:
        return {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cpu_threads - 1}"}
    if cpus <= SMALL_MACHINE_CPUS:
        return {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return {}


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    def __init__(self, spec: ServerSpec, log_path: str | Path, start_timeout_s: float = 900.0,
                 max_restarts: int = 2, log=print):
        self.spec = spec
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._log = log
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    def start(self) -> None:
        check_block_size(self.spec.block_size)
        python = vllm_python(self._log)
        self.port = self.spec.port or free_port(self.spec.host)
        if self.spec.port and not _port_free(self.spec.host, self.spec.port):
            raise EngineError(f"engine.port: port {self.spec.port} on {self.spec.host} is in use; stop what "
                              "listens there or set engine.port=0 (a free port)")
        env = {**os.environ, **self.spec.env, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "PYTHONPATH": os.pathsep.join([str(CARL_SRC), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               "VLLM_CPU_KVCACHE_SPACE": str(self.spec.kv_cache_gb), "VLLM_LOGGING_COLOR": "0",
               "TOKENIZERS_PARALLELISM": "false"}
        binding = cpu_binding(self.spec.cpu_threads, len(os.sched_getaffinity(0)))
        env.update(binding if self.spec.cpu_threads else {k: v for k, v in binding.items() if k not in env})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== carl: starting vLLM (restart {self.restarts}) ====\n".encode())
            log.flush()
            self.proc = _launch(self.spec.argv(python, self.port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent)
        _LIVE.add(self)
        stop_on_sigterm()
        self._wait_healthy(t0)
        self._log(f"vLLM engine up at {self.url} in {time.monotonic() - t0:.0f} s (log {self.log_path})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self, why: str) -> None:
        """Start the server again after it died; EngineError once `max_restarts` are used up."""
        with self._lock:
            if self.alive():
                return  # another thread restarted it
            if _STOPPING.is_set():  # carl is exiting (SIGTERM): the episodes in flight end, none waits on a start
                raise EngineError(f"the vLLM server was stopped because carl is exiting ({why}); not restarted")
            if self.restarts >= self.max_restarts:
                raise EngineError(f"the vLLM server died ({why}) and was restarted {self.restarts} times "
                                  f"already (engine.max_restarts); last lines of {self.log_path}:\n{self.tail()}")
            self.restarts += 1
            self._log(f"vLLM server died ({why}); restarting ({self.restarts}/{self.max_restarts})")
            self.stop()
            self.start()

    def stop(self, grace_s: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        _reap_group(proc.pid)

    def tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.start_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise EngineError(self._start_failure())
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise EngineError(f"the vLLM server did not answer /health within {self.start_timeout_s:.0f} s "
                          f"(engine.start_timeout_s); last lines of {self.log_path}:\n{self.tail()}")

    def _start_failure(self) -> str:
        """One line saying why the server exited while starting, and what to do."""
        log = self.tail(200)
        code = self.proc.returncode if self.proc else None
        self.stop()
        if "Address already in use" in log:
            return (f"the vLLM server could not listen on {self.spec.host}:{self.port} (in use); "
                    "set engine.port=0 for a free port")
        if any(s in log for s in ("out of memory", "OutOfMemory", "Cannot allocate memory", "Insufficient memory",
                                  "No available memory for the cache blocks")):
            return (f"the vLLM server ran out of memory while starting; lower engine.kv_cache_gb (CPU) or "
                    f"engine.gpu_memory_utilization, or engine.max_model_len. Log: {self.log_path}")
        last = [line for line in log.splitlines() if "Error" in line or "error" in line][-3:]
        return (f"the vLLM server exited with code {code} while starting; see {self.log_path}"
                + (":\n" + "\n".join(last) if last else ""))


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _launch(argv: list[str], **popen) -> subprocess.Popen:
    """Popen from one long-lived launcher thread. PR_SET_PDEATHSIG fires when the *thread* that
    forked the child exits, not the process: a server restarted from an episode thread would get
    SIGTERM when the episode pool shuts down. The launcher thread lives as long as carl does."""
    global _LAUNCHER
    with _LAUNCH_LOCK:
        if _LAUNCHER is None:
            _LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carl-vllm-launcher")
        return _LAUNCHER.submit(subprocess.Popen, argv, **popen).result()


_LAUNCHER: ThreadPoolExecutor | None = None
_LAUNCH_LOCK = threading.Lock()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _reap_group(pgid: int) -> None:
    """SIGKILL whatever of the group is still there (vLLM's engine and worker processes)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_LIVE: set[VLLMServer] = set()


_STOPPING = threading.Event()
"""Set when carl stops its servers for good (SIGTERM, interpreter exit): from then on a server that
an episode thread finds dead is not restarted. Before this, every episode in flight at a SIGTERM
restarted the server it had just lost, and the run took a server start (30 s and more) to exit."""


def _stop_all() -> None:
    _STOPPING.set()
    for server in list(_LIVE):
        server.stop(grace_s=5.0)


def stop_on_sigterm() -> None:
    """SIGTERM's default action skips atexit: stop the servers first, then exit as SIGTERM would."""
    if threading.current_thread() is not threading.main_thread() or signal.SIGTERM in _PREVIOUS:
        return
    _PREVIOUS[signal.SIGTERM] = signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame) -> None:
    _stop_all()
    previous = _PREVIOUS.get(signum)
    if callable(previous):
        previous(signum, frame)
    raise SystemExit(128 + signum)


_PREVIOUS: dict[int, object] = {}
atexit.register(_stop_all)
