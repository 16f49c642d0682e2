"""Sharded Muon on 2 and 4 gloo CPU ranks equals single-device Muon; per-shard Muon does not."""

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from carl.systems.cpu_ranks import run_on_cpu_ranks
from carl.systems.muon import MatrixBlocks, Muon, MuonConfig, orthogonalize
from carl.systems.sharded_muon import ShardedMuon

# (shape, blocks): several of one shape (more than W, so more than one bucket), rows not divisible
# by 4 (uneven shards), fewer rows than ranks (an empty shard), per head and per expert blocks.
PARAMS = [
    ((8, 6), MatrixBlocks()),
    ((8, 6), MatrixBlocks()),
    ((8, 6), MatrixBlocks()),
    ((8, 6), MatrixBlocks()),
    ((8, 6), MatrixBlocks()),
    ((7, 12), MatrixBlocks()),
    ((3, 10), MatrixBlocks()),
    ((12, 8), MatrixBlocks(row_blocks=3)),  # q_proj-like: 3 heads of 4 rows
    ((8, 12), MatrixBlocks(col_blocks=3)),  # o_proj-like
    ((4, 6, 5), MatrixBlocks()),  # experts [E, out, in], one matrix per expert
    ((6, 4, 5), MatrixBlocks()),  # 6 experts: uneven over 4 ranks
]
STEPS = 3


def _sharded_equals_single(rank: int, world: int) -> None:
    del rank
    _check_mesh(init_device_mesh("cpu", (world,)), [Shard(0)])
    if world == 4:  # HSDP placements: sharded over 2 ranks, replicated twice
        _check_mesh(init_device_mesh("cpu", (2, 2)), [Replicate(), Shard(0)])


def _check_mesh(mesh, placements: list) -> None:
    config = MuonConfig(lr=0.05, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)  # same on every rank
    full = [torch.randn(shape, generator=gen) for shape, _ in PARAMS]
    grads = [[torch.randn(shape, generator=gen) for shape, _ in PARAMS] for _ in range(STEPS)]

    ref = [torch.nn.Parameter(t.clone()) for t in full]
    sharded = [torch.nn.Parameter(distribute_tensor(t.clone(), mesh, placements)) for t in full]
    ref_opt = Muon([{"params": [p], "blocks": b} for p, (_, b) in zip(ref, PARAMS)], config)
    opt = ShardedMuon([{"params": [p], "blocks": b} for p, (_, b) in zip(sharded, PARAMS)], config)
    for step in range(STEPS):
        for p, q, g in zip(ref, sharded, grads[step]):
            p.grad = g.clone()
            q.grad = distribute_tensor(g.clone(), mesh, placements)
        ref_opt.step()
        opt.step()
        for p, q in zip(ref, sharded):
            torch.testing.assert_close(q.full_tensor(), p.detach(), rtol=1e-6, atol=1e-6)

    # The pitfall: orthogonalizing each rank's shard on its own is a different update.
    for (shape, blocks), g in zip(PARAMS[:1], grads[0][:1]):
        local = distribute_tensor(g, mesh, placements).to_local()
        per_shard = orthogonalize(local, blocks, config).float()
        rows, shard_rank = local.shape[0], mesh.get_local_rank(len(placements) - 1)
        whole = orthogonalize(g, blocks, config).float()[shard_rank * rows : (shard_rank + 1) * rows]
        assert (per_shard - whole).abs().max() > 1e-2

    # carl's single-device Muon refuses DTensor parameters instead of doing that.
    p = torch.nn.Parameter(distribute_tensor(full[0].clone(), mesh, placements))
    p.grad = distribute_tensor(grads[0][0].clone(), mesh, placements)
    with pytest.raises(TypeError, match="ShardedMuon"):
        Muon([p], config).step()


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_muon_equals_single_device_muon(world):
    run_on_cpu_ranks(_sharded_equals_single, world)


def test_sharded_muon_on_plain_tensors_is_muon():
    """One rank is W ranks with communication skipped: plain tensors take the same path."""
    gen = torch.Generator().manual_seed(1)
    shapes = [(8, 6), (8, 6), (5, 9), (3, 4, 6)]
    ref = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    mine = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    ref_opt, opt = Muon(ref), ShardedMuon(mine)
    for _ in range(2):
        for p, q in zip(ref, mine):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        ref_opt.step()
        opt.step()
    for p, q in zip(ref, mine):
        assert torch.equal(p, q)
    assert not isinstance(mine[0], DTensor)
