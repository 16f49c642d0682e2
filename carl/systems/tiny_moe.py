"""A tiny mixture-of-experts causal LM for tests of sharding and optimizers, with the parameter
names and layouts of transformers' Qwen3-MoE (`model.layers.N.self_attn.q_proj.weight`,
`model.layers.N.mlp.gate.weight`, fused 3-D experts `mlp.experts.gate_up_proj [E, 2*I, H]` and
`mlp.experts.down_proj [E, H, I]`), so code written against it runs on the real model too.

Not covered: rotary embeddings, KV cache, attention masks beyond causal. Experts are computed
densely (every expert on every token, weighted by the top-k gates, zero elsewhere): slow at scale,
simple and deterministic here. Importing it costs nothing beyond torch, which matters for tests
that spawn several ranks.

Shape legend: B batch, T tokens, H hidden, E experts, I expert intermediate size, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyMoeConfig:
    vocab_size: int = 64
    """Token ids are 0..vocab_size-1."""
    hidden_size: int = 32
    """Model width H."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Query heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); divides num_heads."""
    head_dim: int = 8
    """Width of one head."""
    num_experts: int = 4
    """Experts per MoE layer, E."""
    top_k: int = 2
    """Experts per token."""
    expert_size: int = 16
    """Intermediate width I of one expert's SwiGLU."""

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "num_experts",
            "top_k",
            "expert_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: got {self.num_kv_heads}, expected a divisor of num_heads")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k: got {self.top_k}, expected <= num_experts ({self.num_experts})")


class Attention(nn.Module):
    def __init__(self, c: TinyMoeConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x_B_T_H: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_B_T_H.shape
        c = self.c
        q = self.q_proj(x_B_T_H).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x_B_T_H).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x_B_T_H).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class Experts(nn.Module):
    """E SwiGLU experts stored as 3-D tensors, as in transformers' Qwen3MoeExperts."""

    def __init__(self, c: TinyMoeConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(c.num_experts, 2 * c.expert_size, c.hidden_size) * 0.1)
        self.down_proj = nn.Parameter(torch.randn(c.num_experts, c.hidden_size, c.expert_size) * 0.1)

    def forward(self, x_N_H: torch.Tensor, gates_N_E: torch.Tensor) -> torch.Tensor:
        gate_N_E_I, up_N_E_I = torch.einsum("nh,eih->nei", x_N_H, self.gate_up_proj).chunk(2, dim=-1)
        out_N_E_H = torch.einsum("nei,ehi->neh", F.silu(gate_N_E_I) * up_N_E_I, self.down_proj)
        return (out_N_E_H * gates_N_E.unsqueeze(-1)).sum(dim=1)


class SparseMoe(nn.Module):
    def __init__(self, c: TinyMoeConfig) -> None:
        super().__init__()
        self.top_k = c.top_k
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)  # the router
        self.experts = Experts(c)

    def forward(self, x_B_T_H: torch.Tensor) -> torch.Tensor:
        x_N_H = x_B_T_H.reshape(-1, x_B_T_H.shape[-1])
        probs_N_E = self.gate(x_N_H).softmax(dim=-1)
        top_p_N_K, top_ids_N_K = probs_N_E.topk(self.top_k, dim=-1)
        gates_N_E = torch.zeros_like(probs_N_E).scatter(
            1, top_ids_N_K, top_p_N_K / top_p_N_K.sum(-1, keepdim=True)
        )
        return self.experts(x_N_H, gates_N_E).view_as(x_B_T_H)


class Block(nn.Module):
    def __init__(self, c: TinyMoeConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c.hidden_size)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size)
        self.mlp = SparseMoe(c)

    def forward(self, x_B_T_H: torch.Tensor) -> torch.Tensor:
        x_B_T_H = x_B_T_H + self.self_attn(self.input_layernorm(x_B_T_H))
        return x_B_T_H + self.mlp(self.post_attention_layernorm(x_B_T_H))


class Backbone(nn.Module):
    def __init__(self, c: TinyMoeConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.num_layers))
        self.norm = nn.RMSNorm(c.hidden_size)

    def forward(self, input_ids_B_T: torch.Tensor) -> torch.Tensor:
        x_B_T_H = self.embed_tokens(input_ids_B_T)
        for layer in self.layers:
            x_B_T_H = layer(x_B_T_H)
        return self.norm(x_B_T_H)


class TinyMoeForCausalLM(nn.Module):
    def __init__(self, config: TinyMoeConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids_B_T: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V]."""
        return self.lm_head(self.model(input_ids_B_T))

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def next_token_loss(model: nn.Module, input_ids_B_T: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting token t+1 from tokens <= t."""
    logits_B_T_V = model(input_ids_B_T[:, :-1])
    return F.cross_entropy(logits_B_T_V.reshape(-1, logits_B_T_V.shape[-1]), input_ids_B_T[:, 1:].reshape(-1))
