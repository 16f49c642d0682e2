"""Sharded Muon: the full-matrix Muon update for FSDP2-sharded (DTensor, Shard(0)) parameters.

Momentum, weight decay and the final add are elementwise and stay on each rank's shard. Only
Newton-Schulz needs whole matrices, so `ShardedMuon` replaces `Muon._orthogonalize`:

1. Group same-shape parameters (same process group, shape, MatrixBlocks) and cut each group into
   buckets of at most W parameters (W = ranks of the Shard(0) mesh dim). Parameter k of a bucket
   is owned by rank k.
2. Scatter: one all_to_all_single sends every rank's shard of parameter k to rank k, which stacks
   the W shards (each padded to ceil(rows / W) rows, so uneven shards work) into the full tensor.
3. The owner runs Newton-Schulz on the full tensor at its natural granularity (carl.systems.muon).
4. Gather: a second all_to_all_single sends each rank its rows of every orthogonalized tensor.

Collectives are asynchronous, so communication of one bucket overlaps compute of another:

    rank r  | scatter b0 |            |            |            |
            |            | scatter b1 | scatter b2 |            |      (in flight, async)
            |            |   NS b0    |   NS b1    |   NS b2    |
            |            |            | gather b0  | gather b1  | gather b2 | wait all, apply

With HSDP ((Replicate, Shard(0)) placements) the exchange runs inside the shard dim's group and
each replica does the same work. A plain tensor is the W = 1 case: the same path with the
collectives skipped. The result equals single-device `Muon` up to float rounding: the owner sees
exactly the single-device matrix (the tests check 2 and 4 ranks over several steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from carl.systems.muon import MatrixBlocks, MatrixUpdate, Muon, orthogonalize


class ShardedMuon(Muon):
    """Muon whose Newton-Schulz runs on whole matrices gathered to owner ranks (see module doc)."""

    def _orthogonalize(self, updates: list[MatrixUpdate]) -> list[torch.Tensor]:
        buckets = _buckets(updates)
        out: list[torch.Tensor | None] = [None] * len(updates)

        scatter = _Scatter(buckets[0]) if buckets else None
        gathers = []
        for i, bucket in enumerate(buckets):
            next_scatter = _Scatter(buckets[i + 1]) if i + 1 < len(buckets) else None
            full = scatter.wait_full()  # this rank's whole parameter, or None if it owns none here
            O_full = orthogonalize(full, bucket.blocks, self.config) if full is not None else None
            gathers.append(_Gather(bucket, O_full))
            scatter = next_scatter
        for gather in gathers:
            for index, O_local in zip(gather.bucket.indices, gather.wait_local()):
                out[index] = O_local
        return out


@dataclass
class _Bucket:
    """Up to W same-shape updates; the k-th is owned by rank k of `group`."""

    indices: list[int]  # positions in the optimizer's update list
    locals_: list[torch.Tensor]  # this rank's shard of each update
    blocks: MatrixBlocks
    full_shape: torch.Size
    group: dist.ProcessGroup | None  # None: plain tensors, W = 1, no communication
    world: int
    rank: int

    @property
    def shard_rows(self) -> int:
        return -(-self.full_shape[0] // self.world)  # torch.chunk / FSDP2 shard size

    @property
    def shard_numel(self) -> int:
        return self.shard_rows * self.full_shape[1:].numel()


def _buckets(updates: list[MatrixUpdate]) -> list[_Bucket]:
    """Same-shape groups in first-seen order (identical on every rank), cut into buckets of W."""
    groups: dict[tuple, list[int]] = {}
    for i, u in enumerate(updates):
        key = (_shard_group(u.param), tuple(u.param.shape), u.blocks, u.update.dtype)
        groups.setdefault(key, []).append(i)
    buckets = []
    for (group, shape, blocks, _), indices in groups.items():
        world = dist.get_world_size(group) if group is not None else 1
        rank = dist.get_rank(group) if group is not None else 0
        for start in range(0, len(indices), world):
            chunk = indices[start : start + world]
            buckets.append(
                _Bucket(
                    chunk, [updates[i].update for i in chunk], blocks, torch.Size(shape), group, world, rank
                )
            )
    return buckets


def _shard_group(param: torch.Tensor) -> dist.ProcessGroup | None:
    """Process group of the mesh dim that shards dim 0; None for a plain tensor."""
    if not isinstance(param, DTensor):
        return None
    shard_dims = [d for d, pl in enumerate(param.placements) if pl == Shard(0)]
    others_ok = all(pl == Shard(0) or isinstance(pl, Replicate) for pl in param.placements)
    if len(shard_dims) != 1 or not others_ok:
        raise ValueError(
            f"ShardedMuon: parameter of shape {tuple(param.shape)} has placements {param.placements}; "
            "expected exactly one Shard(0) and otherwise Replicate (FSDP2 / HSDP)"
        )
    return param.device_mesh.get_group(shard_dims[0])


def _padded(local: torch.Tensor, rows: int) -> torch.Tensor:
    """The shard with zero rows appended up to `rows` (FSDP2's last shards can be short or empty)."""
    if local.shape[0] == rows:
        return local
    out = local.new_zeros((rows, *local.shape[1:]))
    out[: local.shape[0]] = local
    return out


class _Scatter:
    def __init__(self, bucket: _Bucket) -> None:
        b = bucket
        n, E = len(b.indices), b.shard_numel
        self.bucket = b
        self.owns = b.rank < n
        send = torch.cat([_padded(t, b.shard_rows).reshape(-1) for t in b.locals_])
        if b.group is None:
            self.recv, self.work = send, None
            return
        self.recv = send.new_empty(b.world * E if self.owns else 0)
        self.work = dist.all_to_all_single(
            self.recv,
            send,
            output_split_sizes=[E if self.owns else 0] * b.world,
            input_split_sizes=[E] * n + [0] * (b.world - n),
            group=b.group,
            async_op=True,
        )

    def wait_full(self) -> torch.Tensor | None:
        if self.work is not None:
            self.work.wait()
        if not self.owns:
            return None
        b = self.bucket
        return self.recv.view(b.world * b.shard_rows, *b.full_shape[1:])[: b.full_shape[0]]


class _Gather:
    def __init__(self, bucket: _Bucket, O_full: torch.Tensor | None) -> None:
        b = bucket
        n, E = len(b.indices), b.shard_numel
        self.bucket = b
        send = (
            _padded(O_full, b.world * b.shard_rows).reshape(-1)
            if O_full is not None
            else torch.empty(0, dtype=torch.bfloat16, device=b.locals_[0].device)
        )
        if b.group is None:
            self.recv, self.work = send, None
            return
        self.recv = send.new_empty(n * E)
        self.work = dist.all_to_all_single(
            self.recv,
            send,
            output_split_sizes=[E] * n + [0] * (b.world - n),
            input_split_sizes=[E if O_full is not None else 0] * b.world,
            group=b.group,
            async_op=True,
        )

    def wait_local(self) -> list[torch.Tensor]:
        """This rank's rows of each orthogonalized update, shaped like its local shard."""
        if self.work is not None:
            self.work.wait()
        b = self.bucket
        chunks = self.recv.view(len(b.indices), b.shard_rows, *b.full_shape[1:])
        return [chunk[: t.shape[0]] for chunk, t in zip(chunks, b.locals_)]
