"""Router replay for mixture-of-experts models (R3, arXiv 2510.11370).

An MoE router picks top-k experts per token from a softmax over its logits. The rollout engine
and the trainer compute those logits with different numerics (bf16 vs fp32, other kernels,
other batch shapes), so near-ties flip and a token goes through different experts in training
than in the rollout that sampled it: the log-probs disagree and importance ratios blow up.
R3 records the experts chosen at inference and makes the training forward use exactly those,
while the gate weights stay the softmax of the *training* router's logits at the replayed
experts, so the router still receives gradient.

    rollout (inference numerics)                 trainer (training numerics)
    with replay.record() as rec:                 with replay.replay(expert_ids_L_B_T_K):
        model.generate(...)  --- expert ids --->     logits = model(input_ids).logits
    rec.expert_ids_L_B_T_K()   (Segment.routing)    loss.backward()   # grads reach the router

Shapes: L = MoE layers (in module order), B = sequences, T = token positions, K = top-k.
Stored ids are int16 in memory; -1 marks a position without a recorded route (padding, or the
last sampled token, which generation never feeds back through the model). Replay lets such a
position route freely with the training router's own top-k.

The hook sits on the router module's forward, the one piece HF Qwen3-MoE, Mixtral and OLMoE
share: `router(hidden_N_H) -> (logits_or_probs, weights_N_K, expert_ids_N_K)`; whatever the
experts implementation (the eager loop or a fused kernel) consumes the returned ids and weights.
The gate weights are recomputed from the router's input and weight rather than read from the
router's first output, since transformers releases differ on whether that output holds logits
or probabilities.

Recording appends, per MoE layer, the ids of every token the model processes, in call order:
one generate() call = prefill (B, T_prompt) + one (B, 1) step per new token, so the recording
covers positions [0, T_prompt + num_new - 1) of each row. With left-padded batches, slice rows
with their attention mask. Contract: one recording per generate() call (or per sequence of
calls that each continue the previous one's KV cache).

Not covered: expert-parallel inference engines (vLLM, SGLang) need their own recording hook;
the ids they produce use this same layout and encoding.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Router classes of HF MoE models that share the (logits, weights, ids) router interface.
ROUTER_CLASS_NAMES = ("Qwen3MoeTopKRouter", "MixtralTopKRouter", "OlmoeTopKRouter")
ROUTES_FORMAT = "expert_ids_L_T_K"
NO_ROUTE = -1


class RouteRecording:
    """Expert ids captured during one recording, per MoE layer, in the order tokens were processed."""

    def __init__(self, num_layers: int) -> None:
        self._steps_L: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def _append(self, layer: int, expert_ids_B_T_K: torch.Tensor) -> None:
        self._steps_L[layer].append(expert_ids_B_T_K.detach().to(torch.int16))

    @property
    def num_steps(self) -> int:
        """Forward calls recorded (prefill + one per generated token); 0 before anything ran."""
        return len(self._steps_L[0]) if self._steps_L else 0

    def expert_ids_L_B_T_K(self) -> np.ndarray:
        """All recorded ids as an int16 array (L, B, T, K), T = tokens processed per row."""
        if self.num_steps == 0:
            raise ValueError("RouteRecording: nothing was recorded (no forward ran inside record())")
        counts = {len(steps) for steps in self._steps_L}
        if len(counts) != 1:
            raise ValueError(
                f"RouteRecording: MoE layers recorded different numbers of calls: {sorted(counts)}"
            )
        per_layer = [torch.cat(steps, dim=1).cpu().numpy() for steps in self._steps_L]
        return np.stack(per_layer)


class RouterReplay:
    """Records or replays the expert choices of every MoE router of one HF model.

    Explicit state: hooks live only inside a `record()` or `replay()` block, and each block
    belongs to this object. Blocks do not nest.
    """

    def __init__(self, model: nn.Module) -> None:
        routers: list[tuple[nn.Module, nn.Module]] = []  # (parent MoE block, router)
        for parent in model.modules():
            for child in parent.children():
                if type(child).__name__ in ROUTER_CLASS_NAMES:
                    routers.append((parent, child))
        if not routers:
            raise ValueError(
                f"RouterReplay: no MoE router ({', '.join(ROUTER_CLASS_NAMES)}) found in {type(model).__name__}"
            )
        self._routers = routers
        self.num_layers = len(routers)
        self.num_experts = int(routers[0][1].num_experts)
        self.top_k = int(routers[0][1].top_k)
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.routes_replayed = 0  # (token, layer) routes replayed so far
        self.routes_differing = 0  # of which the training router's own top-k set differed

    @contextmanager
    def record(self) -> Iterator[RouteRecording]:
        """Capture the top-k expert ids of every token the model processes inside the block."""
        recording = RouteRecording(self.num_layers)
        batch_shapes: dict[int, tuple[int, int]] = {}

        def make_hooks(layer: int):
            def before_block(block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
                hidden_B_T_H = args[0] if args else kwargs["hidden_states"]
                if hidden_B_T_H.ndim != 3:
                    raise ValueError(
                        f"RouterReplay.record: MoE block input must be (batch, tokens, hidden), "
                        f"got shape {tuple(hidden_B_T_H.shape)}"
                    )
                batch_shapes[layer] = (hidden_B_T_H.shape[0], hidden_B_T_H.shape[1])

            def after_router(router: nn.Module, args: tuple, output: tuple) -> None:
                num_rows, num_tokens = batch_shapes[layer]
                recording._append(layer, output[2].reshape(num_rows, num_tokens, -1))

            return before_block, after_router

        with self._attached():
            for layer, (block, router) in enumerate(self._routers):
                before_block, after_router = make_hooks(layer)
                self._handles.append(block.register_forward_pre_hook(before_block, with_kwargs=True))
                self._handles.append(router.register_forward_hook(after_router))
            yield recording

    @contextmanager
    def replay(self, expert_ids_L_B_T_K: np.ndarray | torch.Tensor) -> Iterator[None]:
        """Make every forward inside the block route token (b, t) of layer l to the given experts.

        Gate weights = softmax of the current router's logits, gathered at the replayed experts
        and renormalised when the model's router renormalises (Qwen3-MoE/OLMoE `norm_topk_prob`;
        Mixtral always), so gradients reach the router weight. Rows of -1 route freely. The
        forward's (B, T) must equal the ids' (B, T); a forward may run several times (gradient
        checkpointing recomputes it) and each run uses the same ids.
        """
        ids_L_B_T_K = torch.as_tensor(np.asarray(expert_ids_L_B_T_K), dtype=torch.long)
        self._check_routes(ids_L_B_T_K)
        on_device: dict[tuple[int, torch.device], torch.Tensor] = {}

        def make_hook(layer: int):
            def after_router(router: nn.Module, args: tuple, output: tuple) -> tuple:
                hidden_N_H = args[0].reshape(-1, router.weight.shape[1])
                key = (layer, hidden_N_H.device)
                if key not in on_device:
                    on_device[key] = ids_L_B_T_K[layer].reshape(-1, self.top_k).to(hidden_N_H.device)
                replayed_N_K = on_device[key]
                if replayed_N_K.shape[0] != hidden_N_H.shape[0]:
                    raise ValueError(
                        f"RouterReplay.replay: layer {layer} got {hidden_N_H.shape[0]} tokens but the replayed "
                        f"routes cover {replayed_N_K.shape[0]} (B*T of expert_ids_L_B_T_K {tuple(ids_L_B_T_K.shape)})"
                    )
                own_ids_N_K = output[2]
                free_N_1 = (replayed_N_K < 0).any(dim=-1, keepdim=True)
                with torch.no_grad():  # how often training numerics alone would have routed elsewhere
                    fixed_N = ~free_N_1[:, 0]
                    differ_N = (own_ids_N_K.sort(-1).values != replayed_N_K.sort(-1).values).any(-1)
                    self.routes_replayed += int(fixed_N.sum())
                    self.routes_differing += int((differ_N & fixed_N).sum())
                ids_N_K = torch.where(free_N_1, own_ids_N_K, replayed_N_K)
                logits_N_E = F.linear(hidden_N_H, router.weight)
                probs_N_E = torch.softmax(logits_N_E, dim=-1, dtype=torch.float32)
                weights_N_K = probs_N_E.gather(-1, ids_N_K)
                # Mixtral's router has no norm_topk_prob attribute: it always renormalises.
                if getattr(router, "norm_topk_prob", True):
                    weights_N_K = weights_N_K / weights_N_K.sum(dim=-1, keepdim=True)
                return output[0], weights_N_K.to(output[1].dtype), ids_N_K.to(own_ids_N_K.dtype)

            return after_router

        with self._attached():
            for layer, (_, router) in enumerate(self._routers):
                self._handles.append(router.register_forward_hook(make_hook(layer)))
            yield

    @contextmanager
    def _attached(self) -> Iterator[None]:
        if self._handles:
            raise RuntimeError("RouterReplay: record() and replay() blocks of one RouterReplay do not nest")
        try:
            yield
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _check_routes(self, ids_L_B_T_K: torch.Tensor) -> None:
        if (
            ids_L_B_T_K.ndim != 4
            or ids_L_B_T_K.shape[0] != self.num_layers
            or ids_L_B_T_K.shape[3] != self.top_k
        ):
            raise ValueError(
                f"RouterReplay.replay: expert_ids_L_B_T_K must have shape ({self.num_layers}, B, T, {self.top_k}) "
                f"(MoE layers, rows, tokens, top-k), got {tuple(ids_L_B_T_K.shape)}"
            )
        if ids_L_B_T_K.numel() and (ids_L_B_T_K.min() < NO_ROUTE or ids_L_B_T_K.max() >= self.num_experts):
            raise ValueError(
                f"RouterReplay.replay: expert ids must lie in [0, {self.num_experts}) or be {NO_ROUTE} (no route), "
                f"got values in [{int(ids_L_B_T_K.min())}, {int(ids_L_B_T_K.max())}]"
            )


def stack_routes(routes: list[np.ndarray], num_tokens: int) -> np.ndarray:
    """Right-pad per-sequence ids (L, T_i, K) with -1 to `num_tokens` and stack to (L, B, T, K)."""
    if not routes:
        raise ValueError("stack_routes: routes is empty")
    num_layers, _, top_k = routes[0].shape
    out_L_B_T_K = np.full((num_layers, len(routes), num_tokens, top_k), NO_ROUTE, dtype=np.int16)
    for row, expert_ids_L_T_K in enumerate(routes):
        if expert_ids_L_T_K.shape[1] > num_tokens:
            raise ValueError(
                f"stack_routes: routes[{row}] has {expert_ids_L_T_K.shape[1]} tokens > {num_tokens}"
            )
        out_L_B_T_K[:, row, : expert_ids_L_T_K.shape[1]] = expert_ids_L_T_K
    return out_L_B_T_K


def encode_routes(expert_ids_L_T_K: np.ndarray, num_experts: int) -> dict[str, Any]:
    """Compact, JSON-ready form for `Segment.routing`: base64 of uint8 ids (uint16 above 255 experts).

    -1 (no route) is stored as the dtype's largest value, which is never an expert id.
    """
    if expert_ids_L_T_K.ndim != 3:
        raise ValueError(
            f"encode_routes: expert_ids_L_T_K must be 3-D (L, T, K), got shape {expert_ids_L_T_K.shape}"
        )
    if expert_ids_L_T_K.size and (expert_ids_L_T_K.min() < NO_ROUTE or expert_ids_L_T_K.max() >= num_experts):
        raise ValueError(f"encode_routes: expert ids must lie in [0, {num_experts}) or be {NO_ROUTE}")
    dtype = np.uint8 if num_experts < 255 else np.uint16
    stored = np.where(expert_ids_L_T_K < 0, np.iinfo(dtype).max, expert_ids_L_T_K).astype(dtype)
    return {
        "format": ROUTES_FORMAT,
        "dtype": np.dtype(dtype).name,
        "shape": list(expert_ids_L_T_K.shape),
        "num_experts": num_experts,
        "data": base64.b64encode(stored.astype(stored.dtype.newbyteorder("<")).tobytes()).decode("ascii"),
    }


def decode_routes(routing: dict[str, Any]) -> np.ndarray:
    """Inverse of `encode_routes`: int16 array (L, T, K) with -1 where no route was recorded."""
    if routing.get("format") != ROUTES_FORMAT:
        raise ValueError(
            f"decode_routes: routing['format'] must be {ROUTES_FORMAT!r}, got {routing.get('format')!r}"
        )
    if routing["dtype"] not in ("uint8", "uint16"):
        raise ValueError(
            f"decode_routes: routing['dtype'] must be 'uint8' or 'uint16', got {routing['dtype']!r}"
        )
    dtype = np.dtype(routing["dtype"]).newbyteorder("<")
    stored = np.frombuffer(base64.b64decode(routing["data"]), dtype=dtype).reshape(routing["shape"])
    ids_L_T_K = stored.astype(np.int16 if dtype.itemsize == 1 else np.int32)
    ids_L_T_K[stored == np.iinfo(dtype).max] = NO_ROUTE
    return ids_L_T_K.astype(np.int16)
