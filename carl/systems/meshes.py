"""Dual-mesh HSDP: two device meshes over one world, one for non-expert weights and one for experts.

Non-expert weights (attention, norms, router, embeddings, head) are small: they are sharded with
FSDP inside a node and replicated across nodes (HSDP on the narrow mesh). Expert weights are most
of a MoE model: they are sharded over a wider group of ranks (the wide mesh), so expert and
non-expert parallel dimensions overlap on the same ranks instead of multiplying (DESIGN.md 1.7:
e.g. CP=2 and EP=8 on 8 GPUs instead of 16).

    world = 8 ranks, 2 nodes of 4
    narrow (replicate=2, shard=4)       wide (expert_replicate=1, expert_shard=8)
      node 0: [0 1 2 3]  shard            [0 1 2 3 4 5 6 7]  experts sharded 8 ways
      node 1: [4 5 6 7]  shard
              replicate ^

Both meshes are applied with FSDP2 `fully_shard`: first every experts module on the wide mesh,
then every transformer block and the root on the narrow mesh (a module's own parameters go to
the mesh of the innermost `fully_shard` that holds them). What this does *not* do: route tokens
to expert-owning ranks (all-to-all expert parallelism). The experts are sharded along the expert
dim (Shard(0) of [E, out, in]) and all-gathered for compute like any FSDP weight; with E a
multiple of expert_shard each rank stores whole experts, which is what a later token-routing
expert-parallel forward builds on. Gradients are averaged over all ranks on both meshes.

Checkpoints are torch.distributed.checkpoint (DCP) directories: every rank writes its shards,
any sharding can load them. `full_state_dict` gathers unsharded CPU tensors to rank 0 for
export; on gloo it must be followed by a barrier or the next collective aborts (it is).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard


@dataclass(frozen=True)
class DualMeshConfig:
    replicate: int = 1
    """Narrow mesh: replicas of the non-expert weights (usually the number of nodes)."""
    shard: int = 1
    """Narrow mesh: FSDP degree of the non-expert weights (usually GPUs per node)."""
    expert_shard: int = 1
    """Wide mesh: ranks the expert weights are sharded over; world / expert_shard replicas."""

    def __post_init__(self) -> None:
        for name in ("replicate", "shard", "expert_shard"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: got {getattr(self, name)}, expected >= 1")


@dataclass(frozen=True)
class DualMesh:
    narrow: DeviceMesh
    """2-D ("replicate", "shard") mesh for non-expert weights."""
    wide: DeviceMesh
    """2-D ("expert_replicate", "expert_shard") mesh for expert weights."""


def build_dual_mesh(config: DualMeshConfig, device_type: str) -> DualMesh:
    """Both meshes over the default process group's ranks (which must already be initialized)."""
    world = dist.get_world_size()
    if config.replicate * config.shard != world:
        raise ValueError(
            f"replicate * shard: got {config.replicate} * {config.shard}, expected the world size {world}"
        )
    if world % config.expert_shard:
        raise ValueError(
            f"expert_shard: got {config.expert_shard}, expected a divisor of the world size {world}"
        )
    narrow = init_device_mesh(
        device_type, (config.replicate, config.shard), mesh_dim_names=("replicate", "shard")
    )
    wide = init_device_mesh(
        device_type,
        (world // config.expert_shard, config.expert_shard),
        mesh_dim_names=("expert_replicate", "expert_shard"),
    )
    return DualMesh(narrow=narrow, wide=wide)


def moe_modules(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """(experts modules, transformer blocks) of a Hugging Face style MoE causal LM
    (`model.model.layers[i].mlp.experts`: Qwen3-MoE, OLMoE, carl.systems.tiny_moe)."""
    blocks = list(model.model.layers)
    experts = [b.mlp.experts for b in blocks if hasattr(b.mlp, "experts")]
    if not experts:
        raise ValueError(f"{type(model).__name__}: no `model.layers[i].mlp.experts` module; not a MoE model?")
    return experts, blocks


def apply_dual_mesh_hsdp(
    model: nn.Module, mesh: DualMesh, experts: list[nn.Module], blocks: list[nn.Module]
) -> None:
    """Shard `model` in place with FSDP2: experts on the wide mesh, everything else on the narrow one."""
    for module in experts:
        fully_shard(module, mesh=mesh.wide)
    for block in blocks:
        fully_shard(block, mesh=mesh.narrow)
    fully_shard(model, mesh=mesh.narrow)


def save_checkpoint(path: str | Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Collective: every rank writes its shards of the model and optimizer states to `path` (DCP)."""
    model_sd, optim_sd = get_state_dict(model, optimizers)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))


def load_checkpoint(path: str | Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> None:
    """Collective: load a `save_checkpoint` directory into an already sharded model and its optimizers."""
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: unsharded CPU state dict on rank 0 (empty dict elsewhere), e.g. for HF export."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dist.barrier()  # gloo: without it the next collective after the cpu_offload gather aborts
    return state
