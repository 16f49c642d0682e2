"""The vLLM engine: token ids to a vLLM server and back, weights by lossless delta.

    episode threads --generate(ids)--> POST /inference/v1/generate {token_ids, sampling_params}
                                       <-- sampled ids, their log-probs, weight_versions spans
    trainer --update_weights(v)------> POST /pause?mode=keep            (running requests freeze)
                                       POST /collective_rpc carl_load_version(weights dir, v)
                                            (carl.engine.vllm_worker: follow the dir, reload, CRC-32)
                                       POST /reset_prefix_cache?reset_running_requests=true
                                            (no KV state of the old weights survives)
                                       POST /update_weight_version v; POST /resume

Prompts go as token ids and the trajectory records the ids the server sampled, never re-tokenized
text. A request that was running across an update continues with the new weights (its KV
recomputed); the response's `weight_versions` says which version sampled which of its tokens, and
`Generation.versions` carries that to the trajectory.

A server carl started (`carl.engine.vllm_server`) that dies is started again (at most
`engine.max_restarts` times), brought back to the current weights version from the weight
store's newest snapshot, and the failed requests are sent again. A server the user runs
(`engine.url`, started with `carl engine serve`) is never restarted by carl.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from carl.engine.base import DefaultSampling, EngineError, EngineStats, SamplingParams, WeightSyncError
from carl.engine.config import EngineConfig
from carl.engine.streams import EpisodeStream
from carl.engine.vllm_server import ServerSpec, VLLMServer
from carl.harness.policies import Generation
from carl.systems.subscriber import VersionFollower

LORA_NAME = "carl-lora"
"""The name the run's adapter is served under (the base model is served as "carl")."""


class VLLMEngine(DefaultSampling):
    weight_names = "checkpoint"

    def __init__(self, model_path: str | Path, weights_dir: str | Path, config: EngineConfig, log_dir: str | Path,
                 max_model_len: int, seed: int = 0, sampling: SamplingParams = SamplingParams(),
                 dtype: str = "bfloat16", record_routes: bool = False, lora_rank: int = 0, log=print):
        from transformers import AutoTokenizer

        super().__init__(sampling)
        self.config = config
        self.seed = seed
        self.weights_dir = str(Path(weights_dir).resolve())
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.policy_version = 0
        self._loaded: int | None = None  # the weights version the server holds (None: the model folder's)
        self.stats = EngineStats()
        self._sync_lock = threading.Lock()  # one weight update (or restart) at a time
        self.client = httpx.Client(timeout=httpx.Timeout(config.request_timeout_s, connect=10.0),
                                   limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        self.server: VLLMServer | None = None
        self.record_routes = record_routes
        self.lora_rank = lora_rank  # > 0: the weights are a LoRA adapter, loaded at run time (_load_adapter)
        self._adapters: VersionFollower | None = None
        self._model: str | None = LORA_NAME if lora_rank and config.url else None  # the served adapter
        self.log = log
        self._warned_routes = False
        self._url = config.url.rstrip("/")
        if not config.url:
            spec = ServerSpec(model=str(model_path), dtype=dtype, max_model_len=max_model_len, port=config.port,
                              enforce_eager=config.enforce_eager, kv_cache_gb=config.kv_cache_gb,
                              gpu_memory_utilization=config.gpu_memory_utilization,
                              cpu_threads=config.cpu_threads, seed=seed, record_routes=record_routes,
                              lora_rank=lora_rank, block_size=config.block_size)
            self.server = VLLMServer(spec, Path(log_dir) / "vllm.log", config.start_timeout_s,
                                     config.max_restarts, log)
            self.server.start()
        self._check_extension()
        if self.server is not None:  # a server carl started holds the model folder's weights: version 0
            self._post("/update_weight_version", {"new_version": "0"})  # (a shared one keeps its label)
        self._start_recording()

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else self._url  # a restart may change the port

    # ------------------------------------------------------------------ generation

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int],
                 seed: int | None = None, sampling: SamplingParams | None = None,
                 max_repeat_tokens: int = 0) -> Generation:
        """See `Engine.generate`. `max_repeat_tokens` does not stop the server's generation early (its
        sampler has no such check): the harness cuts the returned ids where the guard fires."""
        if not prompt_ids:
            raise ValueError("prompt_ids: expected at least one token, got an empty prompt")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: got {max_new_tokens}, expected >= 1")
        sampling = sampling or self.default_sampling
        params: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": sampling.temperature,
                                  "top_p": sampling.top_p, "stop_token_ids": list(stop_ids), "logprobs": 0,
                                  "detokenize": False, "skip_special_tokens": False,
                                  "ignore_eos": True}  # stop on `stop_ids` only, as every carl engine does
        if seed is not None:
            params["seed"] = seed
        request_id = uuid.uuid4().hex
        body = {"token_ids": list(prompt_ids), "sampling_params": params, "output_mode": "tokens",
                "request_id": request_id}
        if self._model is not None:
            body["model"] = self._model
        with self.stats.request(len(prompt_ids)) as generated:
            data = self._post_retrying("/inference/v1/generate", body)
            gen = parse_generation(data, self.policy_version)
            generated.append(len(gen.token_ids))
        if self.record_routes:
            gen = dataclasses.replace(gen, routing=self._take_routes(request_id, len(prompt_ids) + len(gen.token_ids) - 1))
        return gen

    def _start_recording(self) -> None:
        if self.record_routes:
            reply = self._rpc("carl_record_routes")
            if "error" in reply:
                raise EngineError(f"the vLLM engine at {self.url}: {reply['error']}")

    def _take_routes(self, request_id: str, num_positions: int) -> dict[str, Any] | None:
        """The request's routes (carl.engine.vllm_worker.RouteRecorder); None, and a warning once,
        when the worker has none (a server restarted under the request)."""
        routing = self._rpc("carl_take_routes", request_id)
        if routing is None or routing["shape"][1] != num_positions:
            if not self._warned_routes:
                self._warned_routes = True
                got = "none" if routing is None else f"{routing['shape'][1]} positions"
                self.log(f"router replay: the vLLM engine recorded {got} for a request of {num_positions} "
                         "positions; that generation trains with free routing")
            return None
        return routing

    def episode(self, key: str) -> EpisodeStream:
        return EpisodeStream(self, self.seed, key)

    def take_metrics(self) -> dict[str, float]:
        """`engine/*` metrics since the last call (carl.engine.base.EngineStats)."""
        return self.stats.take()

    # ------------------------------------------------------------------ weights

    def update_weights(self, version: int) -> dict[str, Any]:
        with self._sync_lock:
            return self._load(version)

    def _load(self, version: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._post("/pause", None, params={"mode": "keep"})
        try:
            reply = self._load_adapter(version) if self.lora_rank else \
                self._rpc("carl_load_version", self.weights_dir, str(version))
            if "error" in reply:
                raise WeightSyncError(f"the vLLM engine could not load weights version {version}: {reply['error']}")
            if not self._post("/reset_prefix_cache", None, params={"reset_running_requests": "true"}).get("success"):
                raise EngineError("the vLLM engine did not reset its prefix cache after a weight update")
            self._post("/update_weight_version", {"new_version": str(version)})
        finally:
            self._post("/resume", None)
        self._loaded = self.policy_version = version
        reply["rpc_s"] = time.perf_counter() - t0
        return reply

    def _load_adapter(self, version: int) -> dict[str, Any]:
        """LoRA: follow the weights dir to `version` here (deltas, CRC-checked), write the adapters as
        a PEFT folder, and have vLLM load it in place of the last one. The CRC-32s returned are of
        the tensors read back from the folder vLLM loads."""
        from safetensors.torch import load_file

        from carl.engine.hf import tensor_crcs
        from carl.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, saved_name, write_adapter
        from carl.systems.weight_transport import DirectoryTransport

        t0 = time.perf_counter()
        if self._adapters is None:
            self._adapters = VersionFollower(DirectoryTransport(self.weights_dir))
        changed = self._adapters.advance(version)
        if self._adapters.version != version:
            return {"error": f"cannot reach adapter version {version}: {self._adapters.last_error}"}
        state = self._adapters.state
        root = Path(self.weights_dir)
        config = json.loads((root / ADAPTER_CONFIG).read_text())  # written by the trainer's side
        folder = write_adapter(root / "lora" / f"v{version:06d}", state, config)
        on_disk = load_file(str(folder / ADAPTER_WEIGHTS))
        crcs = tensor_crcs({n: on_disk[saved_name(n)] for n in state}, changed)
        t1 = time.perf_counter()
        body = {"lora_name": LORA_NAME, "lora_path": str(folder), "load_inplace": self._model is not None}
        try:
            r = self.client.post(self.url + "/v1/load_lora_adapter", json=body)  # answers text, not JSON
        except httpx.TransportError as e:
            raise EngineError(f"{self.url}/v1/load_lora_adapter: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise EngineError(f"the vLLM engine did not load the LoRA adapter of version {version} "
                              f"(HTTP {r.status_code}: {r.text[:300]}); was it started with LoRA on?")
        self._model = LORA_NAME
        for old in sorted(p for p in (root / "lora").iterdir() if p.name < folder.name)[:-1]:
            shutil.rmtree(old, ignore_errors=True)  # keep this version and the one before
        return {"crc32": crcs, "version": version, "decode_s": t1 - t0, "load_s": time.perf_counter() - t1,
                "tensors_changed": len(changed)}

    # ------------------------------------------------------------------ lifecycle

    def health(self) -> None:
        try:
            r = self.client.get(self.url + "/health", timeout=10.0)
        except httpx.TransportError as e:
            raise EngineError(f"the vLLM engine at {self.url} does not answer: {e}") from None
        if r.status_code != 200:
            raise EngineError(f"the vLLM engine at {self.url} is unhealthy (HTTP {r.status_code})")

    def close(self) -> None:
        self.client.close()
        if self.server is not None:
            self.server.stop()

    # ------------------------------------------------------------------ HTTP

    def _check_extension(self) -> None:
        try:
            ok = self._rpc("carl_ping") == "carl"
        except EngineError as e:
            raise EngineError(f"the vLLM server at {self.url} has no carl worker extension ({e}); start it "
                              "with `carl engine serve`, which adds it and the endpoints carl needs") from None
        if not ok:
            raise EngineError(f"the vLLM server at {self.url} answers carl_ping wrongly; start it with `carl engine serve`")

    def _rpc(self, method: str, *args: str) -> Any:
        data = self._post("/collective_rpc", {"method": method, "args": list(args)})
        results = data.get("results") if isinstance(data, dict) else None
        if not results:
            raise EngineError(f"/collective_rpc {method}: no result ({str(data)[:200]})")
        return results[0]  # one worker (tensor parallel 1); each worker loads its own shard alike

    def _post(self, path: str, body: Any, params: dict[str, str] | None = None) -> Any:
        try:
            r = self.client.post(self.url + path, json=body, params=params)
        except httpx.TransportError as e:
            raise EngineError(f"{self.url}{path}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise EngineError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else {}

    def _post_retrying(self, path: str, body: Any) -> Any:
        """`_post`, and once more after restarting a managed server that died under it."""
        try:
            return self._post(path, body)
        except EngineError as e:
            if self.server is None or self.server.alive():
                raise
            with self._sync_lock:
                if not self.server.alive():
                    self.server.restart(str(e))
                    self._check_extension()
                    self._post("/update_weight_version", {"new_version": "0"})
                    self._start_recording()
                    self._model = None  # a new server holds no adapter
                    if self._loaded is not None:  # back to the trainer's version, from the store
                        self._load(self._loaded)
            return self._post(path, body)


def parse_generation(data: Any, default_version: int) -> Generation:
    """A Generation from /inference/v1/generate's JSON (output_mode "tokens", logprobs 0)."""
    try:
        choice = data["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x["logprob"]) for x in choice["logprobs"]["content"]]
        if choice.get("finish_reason") not in ("stop", "length"):
            raise EngineError(f"the vLLM engine ended a generation with {choice.get('finish_reason')!r}")
        finish = choice["finish_reason"]
        spans = choice.get("weight_versions") or []
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise EngineError(f"the vLLM engine answered something that is not a token generation ({e}): "
                          f"{str(data)[:300]}") from None
    if len(logprobs) != len(ids):
        raise EngineError(f"the vLLM engine returned {len(ids)} token ids but {len(logprobs)} log-probs")
    versions = tuple((_version(s["version"], default_version), int(s["end"]) - int(s["start"])) for s in spans)
    if sum(n for _, n in versions) != len(ids):
        versions = ((default_version, len(ids)),)
    return Generation(ids, logprobs, finish, versions=versions)


def _version(label: Any, default: int) -> int:
    """The int of a weight-version label; vLLM's label before carl set one ("default") is `default`."""
    try:
        return int(label)
    except (TypeError, ValueError):
        return default
