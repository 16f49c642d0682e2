"""The KL anchor's forward pass: the weights RL started from, scoring the policy's own batch.

When only the top N blocks train (`model.trainable_layers = N`), the policy and the reference
share every weight below block -N: the embedding and the frozen trunk. Their hidden states
entering block -N are then the same numbers, so the reference need not recompute them:

    policy forward:     embed -> trunk (frozen) -> h_B_T_D -> top N (trained) -> norm -> head
    reference forward:                            h_B_T_D -> top N (start)   -> norm -> head

`SharedTrunkReference` keeps only the top N blocks of the start weights (plus norm and head),
catches h_B_T_D with a hook while the policy runs, and feeds it to those blocks as
`inputs_embeds`. On SmolLM2 with 6 of 30 blocks trained, the reference pass costs 6 blocks
instead of 30. `load_reference` builds one only where it checks out: the policy's trunk equals
the start weights bit for bit, and on a probe batch the split pass gives the full pass's
log-probs; otherwise (every block trains, an architecture that treats `inputs_embeds`
differently) it returns `FullReference`, which runs the whole start model.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from carl.engine.hf import load_model
from carl.rl.logprobs import sequence_logprobs


class FullReference:
    """The reference as a whole model: one full forward pass per batch."""

    def __init__(self, model: Any):
        self.model = model

    def describe(self) -> str:
        return f"the full start model ({self.model.config.num_hidden_layers} blocks per pass)"

    @contextlib.contextmanager
    def capture(self, policy: Any) -> Iterator[None]:
        yield

    def logprobs(self, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                 temperature: float, prefix_len: int = 0) -> torch.Tensor:
        """`prefix_len`: the rows' common first tokens run once (sequence_logprobs)."""
        return sequence_logprobs(self.model, ids_B_T, attn_B_T, temperature=temperature, score_mask_B_T=mask_B_T,
                                 prefix_len=prefix_len)


class SharedTrunkReference:
    """The reference's top `num_layers` blocks, fed the policy's hidden states entering them."""

    def __init__(self, head: Any, num_layers: int):
        self.model = head  # the start model cut down to its top `num_layers` blocks
        self.num_layers = num_layers
        self._calls: list[torch.Tensor] = []  # what entered the block in each call of the policy's pass

    def describe(self) -> str:
        return f"the start model's top {self.num_layers} blocks on the policy's frozen-trunk hidden states"

    @contextlib.contextmanager
    def capture(self, policy: Any) -> Iterator[None]:
        """While the policy's forward runs inside, keep what enters its block -num_layers: one call
        (h_B_T_D), or two when the pass runs a shared prefix first (h_1_P_D, then h_B_R_D of the rest)."""
        self._calls = []
        with entering_block(policy, -self.num_layers, self._calls.append):
            yield

    def logprobs(self, ids_B_T: torch.Tensor, attn_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                 temperature: float, prefix_len: int = 0) -> torch.Tensor:
        """Log-probs of the captured pass; with `prefix_len` (the pass ran the rows' common first
        tokens once) the top blocks run that prefix once too."""
        calls, self._calls = self._calls, []
        if prefix_len and len(calls) == 2 and calls[0].shape[:2] == (1, prefix_len):
            prefix_1_P_D, rest_B_R_D = calls  # the prefix's states stand for every row's (the same tokens)
            calls = [torch.cat([prefix_1_P_D.expand(rest_B_R_D.shape[0], -1, -1), rest_B_R_D], dim=1)]
        if len(calls) != 1 or calls[0].shape[:2] != ids_B_T.shape:
            raise RuntimeError("SharedTrunkReference.logprobs needs the policy's forward pass on the same batch "
                               f"(prefix_len={prefix_len}) inside `capture(policy)` first")
        return sequence_logprobs(self.model, ids_B_T, attn_B_T, temperature=temperature, score_mask_B_T=mask_B_T,
                                 inputs_embeds_B_T_D=calls[0], prefix_len=prefix_len)


@contextlib.contextmanager
def entering_block(model: Any, index: int, keep: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While forward passes of `model` run inside, call `keep(h_B_T_D)` with what enters its block
    `index` (detached): the frozen trunk's output when `index` is the first trained block."""

    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        keep((args[0] if args else kwargs["hidden_states"]).detach())

    handle = model.model.layers[index].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def load_reference(path: str | Path, policy: Any, trainable_layers: int, device: str = "cpu",
                   probe_tokens: int = 24) -> FullReference | SharedTrunkReference:
    """The KL reference from the checkpoint folder `path`: the shared-trunk form where it checks
    out against `policy` (see the module docstring), else the full model."""
    _, full = load_model(path, torch.float32, device)
    if trainable_layers == 0 or not _trunk_matches(policy, full, trainable_layers):
        return FullReference(full)
    try:
        split = SharedTrunkReference(_top_blocks(full, trainable_layers), trainable_layers)
    except (RuntimeError, ValueError, KeyError, TypeError):  # an architecture that does not cut this way
        return FullReference(full)
    probe_B_T = torch.randint(0, full.config.vocab_size, (2, probe_tokens), generator=torch.Generator().manual_seed(0))
    probe_B_T = probe_B_T.to(device)
    attn_B_T = torch.ones_like(probe_B_T)
    attn_B_T[1, probe_tokens // 2:] = 0  # a right-padded row, as in training batches
    mask_B_T = attn_B_T.bool()
    with torch.no_grad():
        with split.capture(full):  # the full start model's trunk is the policy's trunk (checked above)
            want_B_T = sequence_logprobs(full, probe_B_T, attn_B_T, score_mask_B_T=mask_B_T)
        got_B_T = split.logprobs(probe_B_T, attn_B_T, mask_B_T, temperature=1.0)
    if not torch.allclose(got_B_T, want_B_T, atol=1e-4, rtol=0):
        return FullReference(full)
    return split  # `full` (the trunk's second copy) is freed here


def _trunk_matches(policy: Any, reference: Any, trainable_layers: int) -> bool:
    """The policy's trunk (input embedding and every block below the top `trainable_layers`) is
    frozen and equals the reference's."""
    layers = getattr(getattr(policy, "model", None), "layers", None)
    if layers is None or len(layers) <= trainable_layers:
        return False
    first = len(layers) - trainable_layers
    trunk = [("model.embed_tokens", policy.get_input_embeddings())]
    trunk += [(f"model.layers.{i}", layers[i]) for i in range(first)]
    ref = dict(reference.named_parameters())
    for prefix, module in trunk:
        for name, p in module.named_parameters(prefix=prefix):
            if p.requires_grad or name not in ref or not torch.equal(p.detach(), ref[name]):
                return False
    return True


def _top_blocks(full: Any, num_layers: int) -> Any:
    """A new model of `full`'s architecture with only its top `num_layers` blocks (plus the
    embedding, final norm and head), holding `full`'s weights for them."""
    from transformers import AutoModelForCausalLM

    first = full.config.num_hidden_layers - num_layers
    config = copy.deepcopy(full.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types[first:])
    state = {}
    for name, tensor in full.state_dict().items():
        block = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if block is None:
            state[name] = tensor
        elif int(block[1]) >= first:
            state[f"model.layers.{int(block[1]) - first}.{block[2]}"] = tensor
    head = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    head.load_state_dict(state, strict=True)
    return head.to(next(full.parameters()).device).eval().requires_grad_(False)
