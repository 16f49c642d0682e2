"""The trainer on N ranks: data-parallel steps over an FSDP2-sharded model; one rank is the same path
with the communication skipped.

    torchrun --nproc-per-node N  (gloo on CPU, NCCL on GPUs): every rank holds the same sharded model
    every rank gets the same groups -> the same sequences -> the same micro-batches
    rank r trains micro-batches r, r + N, r + 2N, ... (a rank with fewer runs an empty one, so every
        rank runs the same FSDP collectives: all-gathers in forward, reduce-scatters in backward)
    each micro-batch's loss is multiplied by N: FSDP averages gradients over ranks, so the update
        equals one rank's on all micro-batches (up to float summation order)
    clip_grad_norm_ over the DTensor gradients is the global norm; the optimizer steps each rank's
        shards (AdamW, or `ShardedMuon` for hidden matrices + AdamW for the rest)
    metrics: every rank's sums gathered and added (maxima maxed)

Sharding: `fully_shard` on every transformer block, then the root, over one 1-D mesh of all
ranks; MoE models use the dual-mesh HSDP of carl.systems.meshes instead (`shard_model(...,
dual=DualMeshConfig(...))`). Self-distillation and the KL penalty run on N ranks too: every rank
runs the same sharded forwards in one order per micro-batch (policy, reference, teacher), and a
rank with no teacher turn or no micro-batch runs an empty one (`idle_forward`), so the ranks'
all-gathers pair up.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

OPTIMIZERS = ("adamw", "muon")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        """This process's place in the default process group (one rank when there is none)."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def share(self, items: list[Any]) -> list[Any]:
        """This rank's items: every world-th from its rank on, padded with None to ceil(len / world)."""
        mine = items[self.rank :: self.world]
        return mine + [None] * (math.ceil(len(items) / self.world) - len(mine))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (a list of one on one rank)."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """`obj` of rank `src` on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def idle_micro_batch(model: torch.nn.Module, pad_id: int, device: torch.device,
                     extra_forwards: tuple[torch.nn.Module, ...] = ()) -> None:
    """A forward and backward that change nothing, for a rank with fewer micro-batches than the
    others: every rank must run the same FSDP collectives (all-gathers, reduce-scatters), in the
    same order. `extra_forwards`: the sharded models the other ranks run between a micro-batch's
    forward and its backward (the KL reference, the self-distillation teacher)."""
    ids = torch.full((1, 2), pad_id, device=device)
    loss = model(input_ids=ids).logits.sum() * 0.0
    for other in extra_forwards:
        idle_forward(other, pad_id, device)
    loss.backward()


@torch.no_grad()
def idle_forward(model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
    """A no-grad forward of a sharded model whose result nobody needs: its all-gathers, for a rank
    that has nothing to run through it in a micro-batch where the other ranks do."""
    model(input_ids=torch.full((1, 2), pad_id, device=device))


def init_from_env() -> Ranks:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR... in the
    environment): NCCL with CUDA, gloo on CPU. Without torchrun: one rank, nothing to join."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return Ranks.current()


@contextmanager
def torchrun_ranks() -> Iterator[Ranks]:
    """`init_from_env`, and leave the process group on the way out, returning or raising. A group the
    caller set up stays up. Leaving the group is not enough for a follower rank to exit cleanly: end
    its process with `exit_follower` (the `carl` command does)."""
    ours = not (dist.is_available() and dist.is_initialized())
    ranks = init_from_env()
    try:
        yield ranks
    finally:
        if ours and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def exit_follower(code: int) -> NoReturn:
    """End a torchrun follower's process (rank 1..N-1) now, without the interpreter's teardown.

    A gloo worker thread drops its last reference to a finished collective's tensors just after the
    caller's wait returns; if Python had dropped its own already, that release needs the GIL, and a
    thread that asks for the GIL once the interpreter is finalizing is ended with pthread_exit, which
    unwinds through a noexcept C++ frame: SIGABRT, "terminate called without an active exception"
    (C++ stacks: ProcessGroupGloo::runLoop -> TensorImpl::decref_pyobject -> pthread_exit). A follower
    exits within milliseconds of its last collective (rank 0's "stop"), so it loses that race now and
    then, destroyed group or not: a two-rank FSDP script here aborted on rank 1 in 8 of 60 runs (3 of
    30 with a barrier before leaving the group), the two-rank `carl train` test in 2 of 60 (and failed
    CI once); with the process ended by os._exit, 0 of 30 and 0 of 60. Everything a follower writes is written
    before it returns (rank 0 writes the run's files), so only the standard streams need flushing."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shard_model(model: torch.nn.Module, ranks: Ranks, dual: Any = None) -> torch.nn.Module:
    """Shard `model` in place with FSDP2 over all ranks (nothing on one rank); `dual`: a
    carl.systems.meshes.DualMeshConfig for MoE models (experts on the wide mesh)."""
    if ranks.world == 1:
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device_type = next(model.parameters()).device.type
    if dual is not None:
        from carl.systems.meshes import apply_dual_mesh_hsdp, build_dual_mesh, moe_modules

        apply_dual_mesh_hsdp(model, build_dual_mesh(dual, device_type), *moe_modules(model))
        return model
    mesh = init_device_mesh(device_type, (ranks.world,), mesh_dim_names=("shard",))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def make_optimizer(name: str, model: torch.nn.Module, lr: float, weight_decay: float, sharded: bool) -> "Optimizers":
    """["adamw"]: AdamW on every trainable parameter; ["muon"]: Muon (ShardedMuon on sharded
    models) on hidden matrices and AdamW on embeddings, head, norms and biases
    (carl.systems.muon.muon_param_groups), stepped together as one `Optimizers`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"rl.optimizer: got {name!r}, expected one of {list(OPTIMIZERS)}")
    if name == "adamw":
        return Optimizers([torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                             weight_decay=weight_decay)])
    from carl.systems.muon import Muon, MuonConfig, muon_param_groups
    from carl.systems.sharded_muon import ShardedMuon

    groups, adamw = muon_param_groups(model)
    muon_cls = ShardedMuon if sharded else Muon
    out = [muon_cls(groups, MuonConfig(lr=lr, weight_decay=weight_decay))] if groups else []
    return Optimizers(out + ([torch.optim.AdamW(adamw, lr=lr, weight_decay=weight_decay)] if adamw else []))


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Add the ranks' metric sums key by key; keys ending in "max" take the maximum."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = max(out.get(k, v), v) if k.endswith("max") else out.get(k, 0.0) + v
    return out


class Optimizers:
    """Several optimizers stepped as one (Muon for the hidden matrices, AdamW for the rest); one
    AdamW is the simple case of the same object. Checkpoints hold every optimizer's state."""

    def __init__(self, optimizers: list[Any]):
        if not optimizers:
            raise ValueError("optimizers: expected at least one (no trainable parameters?)")
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def clear_state(self) -> None:
        """Forget the moments (RL starts from fresh ones after the warm start)."""
        for o in self.optimizers:
            o.state.clear()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        states = state["optimizers"] if "optimizers" in state else [state]  # checkpoints of one AdamW
        if len(states) != len(self.optimizers):
            raise ValueError(f"optimizer state: {len(states)} optimizers in the checkpoint, "
                             f"{len(self.optimizers)} here (another rl.optimizer?)")
        for o, s in zip(self.optimizers, states):
            o.load_state_dict(s)
