"""Dual-mesh HSDP on 4 gloo CPU ranks: the sharded training step is the single-process step, and
DCP checkpoints save and load (model and optimizer state)."""

import copy

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from carl.systems.cpu_ranks import run_on_cpu_ranks
from carl.systems.meshes import (
    DualMeshConfig,
    apply_dual_mesh_hsdp,
    build_dual_mesh,
    full_state_dict,
    load_checkpoint,
    moe_modules,
    save_checkpoint,
)
from carl.systems.muon import Muon, MuonConfig, muon_param_groups
from carl.systems.sharded_muon import ShardedMuon
from carl.systems.tiny_moe import TinyMoeConfig, TinyMoeForCausalLM, next_token_loss

CONFIG = TinyMoeConfig(num_experts=4, num_layers=2)
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _optimizers(model, muon_cls):
    muon_groups, adamw_params = muon_param_groups(model)
    return [muon_cls(muon_groups, MuonConfig(lr=0.02)), torch.optim.AdamW(adamw_params, lr=1e-2)]


def _step_both(model, opts, ref, ref_opts, batch_B_T, rank, world):
    """One training step on the sharded model (its rows of the batch) and the reference (all rows).

    Gradients must match to float tolerance. Then the reference gradients are copied into the
    shards before the optimizer steps: Newton-Schulz runs in bf16 and turns a 1e-7 reduction-order
    difference into a whole bf16 flip now and then (~2e-4 here), which would hide real errors
    behind a loose tolerance. With identical inputs the updates must match tightly.
    """
    ref_loss = next_token_loss(ref, batch_B_T)
    ref_loss.backward()
    rows = batch_B_T.shape[0] // world  # equal rows per rank: the mean of rank means is the global mean
    loss = next_token_loss(model, batch_B_T[rank * rows : (rank + 1) * rows])
    loss.backward()
    loss = loss.detach()
    torch.distributed.all_reduce(loss)
    torch.testing.assert_close(loss / world, ref_loss.detach(), **TOL)

    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        ref_grad = ref_params[name].grad
        torch.testing.assert_close(
            p.grad.full_tensor(), ref_grad, **TOL, msg=lambda m, name=name: f"{name}: {m}"
        )
        p.grad.to_local().copy_(
            distribute_tensor(ref_grad, p.device_mesh, p.placements, src_data_rank=None).to_local()
        )
    for opt in [*opts, *ref_opts]:
        opt.step()
        opt.zero_grad()
    _assert_same_params(model, ref)


def _assert_same_params(sharded, ref):
    ref_params = dict(ref.named_parameters())
    for name, p in sharded.named_parameters():
        torch.testing.assert_close(
            p.full_tensor(), ref_params[name].detach(), **TOL, msg=lambda m, name=name: f"{name}: {m}"
        )


def _dual_mesh_rank(rank: int, world: int, ckpt_dir: str) -> None:
    torch.manual_seed(0)
    ref = TinyMoeForCausalLM(CONFIG)
    model = copy.deepcopy(ref)
    experts, blocks = moe_modules(model)
    mesh = build_dual_mesh(DualMeshConfig(replicate=2, shard=2, expert_shard=4), "cpu")
    apply_dual_mesh_hsdp(model, mesh, experts, blocks)

    expert_w = model.model.layers[0].mlp.experts.gate_up_proj
    attn_w = model.model.layers[0].self_attn.q_proj.weight
    assert expert_w.device_mesh is mesh.wide and expert_w.placements == (Replicate(), Shard(0))
    assert expert_w.to_local().shape[0] == CONFIG.num_experts // 4  # one whole expert per rank
    assert attn_w.device_mesh is mesh.narrow and attn_w.placements == (Replicate(), Shard(0))

    ref_opts, opts = _optimizers(ref, Muon), _optimizers(model, ShardedMuon)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, CONFIG.vocab_size, (2 * world, 9), generator=gen) for _ in range(3)]
    for batch in batches[:2]:
        _step_both(model, opts, ref, ref_opts, batch, rank, world)

    save_checkpoint(ckpt_dir, model, opts)
    full = full_state_dict(model)
    if rank == 0:
        for name, t in ref.state_dict().items():
            torch.testing.assert_close(full[name], t, **TOL, msg=lambda m, name=name: f"{name}: {m}")

    # Diverge, load the checkpoint back, and take the third step on both: equal again only if
    # the parameters and the Muon/AdamW states were restored.
    next_token_loss(model, batches[2]).backward()
    for opt in opts:
        opt.step()
        opt.zero_grad()
    load_checkpoint(ckpt_dir, model, opts)
    _assert_same_params(model, ref)
    _step_both(model, opts, ref, ref_opts, batches[2], rank, world)


@pytest.mark.distributed
def test_dual_mesh_hsdp_step_matches_single_process_and_checkpoints(tmp_path):
    run_on_cpu_ranks(_dual_mesh_rank, 4, str(tmp_path / "ckpt"))


def test_dual_mesh_config_names_the_bad_field():
    with pytest.raises(ValueError, match="expert_shard"):
        DualMeshConfig(expert_shard=0)
