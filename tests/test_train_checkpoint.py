"""Exact resume: 4 RL steps in one go equal 2 steps, a checkpoint, and 2 more steps in fresh objects.

The loop below makes the same calls as `carl.train.loop.train`'s RL phase (rl_step, state update,
save_checkpoint; on resume: load the checkpoint's model folder, load_trainer_state), with rollouts
drawn from the global RNG streams instead of sandboxes, so a resume that forgot the RNG, the data
position or the optimizer state gives different weights.
"""

import errno
import random
from pathlib import Path

import numpy as np
import pytest
from safetensors import SafetensorError
import torch
from tiny_hf import save_tiny_model
from train_fakes import token_rollout

from carl.engine.hf import load_model
from carl.train.checkpoint import latest_checkpoint, load_trainer_state, rng_state, save_checkpoint
from carl.train.config import RLConfig
from carl.train.loop import seed_everything, set_trainable, task_order
from carl.train.step import rl_step

CFG = RLConfig(sd_weight=0.0, lr=1e-3)
NUM_TASKS, TASKS_PER_STEP, G = 5, 2, 3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def _fake_groups(task_ids):
    """G rollouts per task: tokens from torch's RNG, rewards from python's, lengths from numpy's."""
    groups = []
    for task in task_ids:
        group = []
        for _ in range(G):
            n_gen = int(np.random.randint(3, 8))
            ids = [task + 3] + torch.randint(3, 300, (10 + n_gen,)).tolist()
            group.append(token_rollout(ids, [False] * 11 + [True] * n_gen, reward=float(random.random() < 0.5)))
        groups.append(group)
    return groups


def _trainer(path):
    tokenizer, model = load_model(path, torch.float32)
    params = set_trainable(model, 1)
    optimizer = torch.optim.AdamW(params, lr=CFG.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    return tokenizer, model, optimizer, scheduler


def _run(run_dir, tiny_dir, until_step):
    """Start (or resume from run_dir's latest checkpoint) and train to `until_step`."""
    seed_everything(0)
    tokenizer, model, optimizer, scheduler = _trainer(tiny_dir)
    state = {"phase": "rl", "rl_step": 0, "task_pos": 0}
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        model.load_state_dict(load_model(ckpt / "model", torch.float32)[1].state_dict())
        _, state = load_trainer_state(ckpt, optimizer, scheduler)
    order = task_order(NUM_TASKS, seed=0)
    while state["rl_step"] < until_step:
        batch = [order[(state["task_pos"] + i) % NUM_TASKS] for i in range(TASKS_PER_STEP)]
        rl_step(model, optimizer, scheduler, _fake_groups(batch), CFG, tokenizer, tokenizer.pad_token_id, 32.0)
        state["rl_step"], state["task_pos"] = state["rl_step"] + 1, state["task_pos"] + TASKS_PER_STEP
        save_checkpoint(run_dir, state["rl_step"], model, tokenizer, optimizer, scheduler, state)
    return model, optimizer, scheduler, state


def test_resume_from_a_checkpoint_continues_exactly(tmp_path, tiny_dir):
    model_a, opt_a, sched_a, state_a = _run(tmp_path / "a", tiny_dir, until_step=4)
    rng_a = rng_state()

    _run(tmp_path / "b", tiny_dir, until_step=2)
    assert latest_checkpoint(tmp_path / "b").name == "step_000002"
    model_b, opt_b, sched_b, state_b = _run(tmp_path / "b", tiny_dir, until_step=4)  # fresh objects, resumed
    rng_b = rng_state()

    assert state_a == state_b == {"phase": "rl", "rl_step": 4, "task_pos": 8}
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(model_a.state_dict()["model.layers.1.mlp.up_proj.weight"],
                           load_model(tiny_dir, torch.float32)[1].state_dict()["model.layers.1.mlp.up_proj.weight"])
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i in sa["state"]:
        for k in sa["state"][i]:
            assert torch.equal(sa["state"][i][k], sb["state"][i][k]), (i, k)
    assert sched_a.state_dict() == sched_b.state_dict()
    assert torch.equal(rng_a["torch"], rng_b["torch"])
    assert rng_a["python"] == rng_b["python"]
    assert all(np.array_equal(x, y) for x, y in zip(rng_a["numpy"], rng_b["numpy"]))


def test_a_crash_mid_checkpoint_is_ignored_and_old_checkpoints_are_pruned(tmp_path, tiny_dir):
    tokenizer, model, optimizer, scheduler = _trainer(tiny_dir)
    for step in (0, 1, 2, 3):
        save_checkpoint(tmp_path, step, model, tokenizer, optimizer, scheduler, {"rl_step": step}, keep=2)
    root = tmp_path / "checkpoints"
    # step 0 (the warm start) is pinned; of the others the newest 2 stay
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000000", "step_000002", "step_000003"]

    crashed = root / "step_000004.tmp-x1y2"  # a writer killed before its rename
    (crashed / "model").mkdir(parents=True)
    (crashed / "trainer.pt").write_bytes(b"half a pickle")
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt == root / "step_000003"
    step, state = load_trainer_state(ckpt, optimizer, scheduler)
    assert (step, state) == (3, {"rl_step": 3})
    assert latest_checkpoint(tmp_path / "nothing_here") is None


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")])
def test_a_full_disk_mid_checkpoint_says_what_to_do_and_removes_the_partial_one(tmp_path, tiny_dir, monkeypatch, error):
    """The second error is how safetensors reports it (its own exception class, not an OSError, no
    errno): what a run that filled the disk raised on 2026-12-06, as a bare traceback before."""
    from carl.errors import UserError

    tokenizer, model, optimizer, scheduler = _trainer(tiny_dir)
    save_checkpoint(tmp_path, 0, model, tokenizer, optimizer, scheduler, {"rl_step": 0})

    def fill_the_disk(folder, **kwargs):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"x" * 1000)
        raise error

    monkeypatch.setattr(model, "save_pretrained", fill_the_disk)
    with pytest.raises(UserError, match=r"no space left .* checkpoint step 1 .* GB free now.* resumes from step_000000"):
        save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, scheduler, {"rl_step": 1})
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000000"]  # nothing partial left
    assert latest_checkpoint(tmp_path) == root / "step_000000"
    monkeypatch.setattr(model, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(PermissionError):  # other I/O errors are not a full disk
        save_checkpoint(tmp_path, 1, model, tokenizer, optimizer, scheduler, {"rl_step": 1})
