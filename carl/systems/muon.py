"""Muon: momentum, then orthogonalize each matrix update with Newton-Schulz (the math, no communication).

    update = Nesterov-momentum(grad)                       # elementwise, works on any shard
    O      = NewtonSchulz5(update viewed as matrices)      # needs whole matrices
    param  = param * (1 - lr * wd) - lr * 0.2 * sqrt(max(A, B)) * O

References: Keller Jordan, "Muon: An optimizer for hidden layers in neural networks" (2024),
https://kellerjordan.github.io/posts/muon/ (quintic Newton-Schulz, coefficients 3.4445, -4.7750,
2.0315, 5 steps, bf16); Liu et al., "Muon is Scalable for LLM Training" (Moonshot, arXiv 2502.16982),
section 2.2: scaling the orthogonalized update by 0.2 * sqrt(max(A, B)) gives it the RMS (~0.2) of an
AdamW update, so AdamW's learning rate and weight decay carry over. The momentum and weight-decay
conventions match `torch.optim.Muon` (torch 2.13) with `adjust_lr_fn="match_rms_adamw"`, which the
tests check.

Natural granularity: a parameter is cut into a batch of matrices before Newton-Schulz by a
`MatrixBlocks` spec. Leading dims of a 3-D expert weight `[E, out, in]` are always batch (one matrix
per expert); `row_blocks`/`col_blocks` cut the last two dims further, e.g. q/k/v projections
`[heads * head_dim, hidden]` per head with `row_blocks=heads`, o_proj `[hidden, heads * head_dim]`
with `col_blocks=heads`. The RMS-matching scale uses the shape of one block.

Shape legend: N = number of matrices in a batch, A x B = one matrix.

`Muon` here runs on ordinary (unsharded) tensors. On FSDP2 DTensor parameters it raises TypeError, because
orthogonalizing each rank's shard separately is a different (wrong) update; `ShardedMuon` in
`carl.systems.sharded_muon` adds the communication that makes it the full-matrix math.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class MuonConfig:
    lr: float = 0.02
    """Learning rate before the RMS-matching scale (with update_rms=0.2 use an AdamW-sized lr)."""
    momentum: float = 0.95
    """Momentum coefficient mu: buf = mu * buf + (1 - mu) * grad."""
    nesterov: bool = True
    """Use the Nesterov look-ahead (1 - mu) * grad + mu * buf instead of buf."""
    weight_decay: float = 0.1
    """Decoupled weight decay: param *= 1 - lr * weight_decay (unscaled lr, as torch.optim.Muon)."""
    ns_steps: int = 5
    """Newton-Schulz iterations."""
    ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
    """Quintic Newton-Schulz coefficients (a, b, c) from Keller Jordan's Muon."""
    eps: float = 1e-7
    """Floor of the Frobenius norm the update is divided by before Newton-Schulz."""
    update_rms: float = 0.2
    """Target RMS of the update per unit lr: scale = update_rms * sqrt(max(A, B)) (Moonshot)."""

    def __post_init__(self) -> None:
        if not self.lr >= 0:
            raise ValueError(f"lr: got {self.lr}, expected >= 0")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum: got {self.momentum}, expected 0 <= momentum < 1")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay: got {self.weight_decay}, expected >= 0")
        if not 1 <= self.ns_steps < 100:
            raise ValueError(f"ns_steps: got {self.ns_steps}, expected 1..99")
        if len(self.ns_coefficients) != 3:
            raise ValueError(f"ns_coefficients: got {self.ns_coefficients}, expected three floats (a, b, c)")
        if not self.eps > 0:
            raise ValueError(f"eps: got {self.eps}, expected > 0")
        if not self.update_rms > 0:
            raise ValueError(f"update_rms: got {self.update_rms}, expected > 0")


@dataclass(frozen=True)
class MatrixBlocks:
    """How one parameter is cut into the matrices that are orthogonalized separately."""

    row_blocks: int = 1
    """Cut the second-to-last dim into this many equal blocks (e.g. heads of q/k/v_proj)."""
    col_blocks: int = 1
    """Cut the last dim into this many equal blocks (e.g. heads of o_proj)."""

    def __post_init__(self) -> None:
        if self.row_blocks < 1:
            raise ValueError(f"row_blocks: got {self.row_blocks}, expected >= 1")
        if self.col_blocks < 1:
            raise ValueError(f"col_blocks: got {self.col_blocks}, expected >= 1")

    def matrix_shape(self, shape: tuple[int, ...] | torch.Size) -> tuple[int, int]:
        """(A, B) of one block of a parameter of `shape`; ValueError if it does not divide."""
        if len(shape) < 2:
            raise ValueError(f"shape: got {tuple(shape)}, Muon needs a parameter with >= 2 dims")
        rows, cols = shape[-2], shape[-1]
        if rows % self.row_blocks or cols % self.col_blocks:
            raise ValueError(f"blocks: {self} does not divide the last two dims of shape {tuple(shape)}")
        return rows // self.row_blocks, cols // self.col_blocks


Granularity = Callable[[str, nn.Parameter], MatrixBlocks]
"""Maps (parameter name, parameter) to how it is cut into matrices."""


def whole_matrices(name: str, param: nn.Parameter) -> MatrixBlocks:
    """Each 2-D weight is one matrix; a 3-D weight [E, out, in] is one matrix per expert."""
    return MatrixBlocks()


def per_head(num_heads: int, num_kv_heads: int) -> Granularity:
    """Natural granularity for HF-style names: per attention head, per expert, gate apart from up.

    q_proj [heads*d, hidden] and k/v_proj [kv_heads*d, hidden] are cut by rows, o_proj
    [hidden, heads*d] by columns; fused expert gate_up_proj [E, 2*I, hidden] into gate and up.
    """

    def granularity(name: str, param: nn.Parameter) -> MatrixBlocks:
        if name.endswith("q_proj.weight"):
            return MatrixBlocks(row_blocks=num_heads)
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            return MatrixBlocks(row_blocks=num_kv_heads)
        if name.endswith("o_proj.weight"):
            return MatrixBlocks(col_blocks=num_heads)
        if name.endswith("gate_up_proj"):
            return MatrixBlocks(row_blocks=2)
        return MatrixBlocks()

    return granularity


def muon_param_groups(
    model: nn.Module, granularity: Granularity = whole_matrices
) -> tuple[list[dict], list[nn.Parameter]]:
    """Route parameters: hidden weights with >= 2 dims to Muon, the rest to AdamW.

    AdamW gets embeddings (any nn.Embedding), the output head (`get_output_embeddings()` when the
    model has it, else a module named `lm_head`), norms, biases and every other 1-D parameter.
    Returns (Muon param groups, one per distinct MatrixBlocks with key "blocks"; AdamW params).
    Tied weights appear once, on the AdamW side.
    """
    adamw_ids: set[int] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or module_name.split(".")[-1] == "lm_head":
            adamw_ids.update(id(p) for p in module.parameters(recurse=False))
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is not None:
        adamw_ids.update(id(p) for p in head.parameters(recurse=False))

    by_blocks: dict[MatrixBlocks, list[nn.Parameter]] = {}
    adamw: list[nn.Parameter] = []
    for name, param in model.named_parameters():  # yields each shared parameter once
        if not param.requires_grad:
            continue
        if param.ndim < 2 or id(param) in adamw_ids:
            adamw.append(param)
            continue
        blocks = granularity(name, param)
        blocks.matrix_shape(param.shape)  # fail now, not at the first step
        by_blocks.setdefault(blocks, []).append(param)
    groups = [{"params": params, "blocks": blocks} for blocks, params in by_blocks.items()]
    return groups, adamw


def newton_schulz(
    G_N_A_B: torch.Tensor, steps: int, coefficients: tuple[float, float, float], eps: float
) -> torch.Tensor:
    """Approximately orthogonalize each matrix of a batch (U S V^T -> U S' V^T, S' ~ 1), in bf16.

    The quintic iteration X <- a X + (b X X^T + c (X X^T)^2) X after dividing by the Frobenius
    norm (so the spectral norm is <= 1); runs on the wide orientation so X X^T is the small Gram.
    """
    a, b, c = coefficients
    X = G_N_A_B.bfloat16()
    tall = G_N_A_B.size(-2) > G_N_A_B.size(-1)
    if tall:
        X = X.mT
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = X @ X.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.baddbmm(X, poly, X, beta=a)
    return X.mT if tall else X


def to_matrices(t: torch.Tensor, blocks: MatrixBlocks) -> torch.Tensor:
    """View a parameter-shaped tensor [..., R, C] as the batch of blocks [N, A, B]."""
    A, B = blocks.matrix_shape(t.shape)
    rb, cb = blocks.row_blocks, blocks.col_blocks
    x = t.reshape(-1, rb, A, cb, B).permute(0, 1, 3, 2, 4)
    return x.reshape(-1, A, B)


def from_matrices(m_N_A_B: torch.Tensor, blocks: MatrixBlocks, shape: torch.Size) -> torch.Tensor:
    """Inverse of `to_matrices`."""
    A, B = blocks.matrix_shape(shape)
    x = m_N_A_B.reshape(-1, blocks.row_blocks, blocks.col_blocks, A, B).permute(0, 1, 3, 2, 4)
    return x.reshape(shape)


def orthogonalize(update: torch.Tensor, blocks: MatrixBlocks, config: MuonConfig) -> torch.Tensor:
    """Newton-Schulz on every block of a whole (unsharded) parameter-shaped update; bf16 result."""
    O_N_A_B = newton_schulz(to_matrices(update, blocks), config.ns_steps, config.ns_coefficients, config.eps)
    return from_matrices(O_N_A_B, blocks, update.shape)


def momentum_update_(buf: torch.Tensor, grad: torch.Tensor, momentum: float, nesterov: bool) -> torch.Tensor:
    """Advance the momentum buffer in place and return the update to orthogonalize (elementwise)."""
    buf.lerp_(grad, 1 - momentum)
    return grad.lerp(buf, momentum) if nesterov else buf


def rms_matched_lr(lr: float, matrix_shape: tuple[int, int], update_rms: float) -> float:
    """lr * update_rms * sqrt(max(A, B)): an orthogonal A x B matrix has RMS 1/sqrt(max(A, B))."""
    return lr * update_rms * math.sqrt(max(matrix_shape))


@dataclass
class MatrixUpdate:
    """One parameter's momentum update, before orthogonalization (local shard if sharded)."""

    param: torch.Tensor
    update: torch.Tensor
    blocks: MatrixBlocks


class Muon(torch.optim.Optimizer):
    """Muon on whole tensors. Groups may set lr, momentum, nesterov, weight_decay and blocks.

    `step()` reads top to bottom: momentum per parameter, `_orthogonalize` (the only part that
    differs when parameters are sharded), then weight decay and the RMS-matched update.
    """

    def __init__(self, params, config: MuonConfig = MuonConfig()) -> None:
        self.config = config
        defaults = {
            k: v for k, v in asdict(config).items() if k in ("lr", "momentum", "nesterov", "weight_decay")
        }
        defaults["blocks"] = MatrixBlocks()
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                group["blocks"].matrix_shape(p.shape)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        updates: list[MatrixUpdate] = []
        hyper: list[dict] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                update = momentum_update_(
                    _local(state["momentum_buffer"]), _local(p.grad), group["momentum"], group["nesterov"]
                )
                updates.append(MatrixUpdate(p, update, group["blocks"]))
                hyper.append(group)

        orthogonalized = self._orthogonalize(updates)

        for u, ortho, group in zip(updates, orthogonalized, hyper):
            lr = group["lr"]
            p_local = _local(u.param)
            p_local.mul_(1 - lr * group["weight_decay"])
            step_lr = rms_matched_lr(lr, u.blocks.matrix_shape(u.param.shape), self.config.update_rms)
            p_local.add_(ortho, alpha=-step_lr)
        return loss

    def _orthogonalize(self, updates: list[MatrixUpdate]) -> list[torch.Tensor]:
        """Orthogonalized update per parameter, shaped like its (local) update."""
        for u in updates:
            if isinstance(u.param, DTensor):
                raise TypeError(
                    f"Muon got a DTensor parameter of shape {tuple(u.param.shape)} with placements "
                    f"{u.param.placements}: orthogonalizing each shard separately is not Muon; use "
                    "carl.systems.sharded_muon.ShardedMuon"
                )
        return [orthogonalize(u.update, u.blocks, self.config) for u in updates]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (shares storage under no_grad), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t
