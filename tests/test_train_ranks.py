"""The trainer on 2 gloo CPU ranks (FSDP2-sharded model, each rank its share of the micro-batches)
gives the same losses and weights as 1 rank over several RL steps, with AdamW and with Muon
(ShardedMuon on the sharded model)."""

import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from train_fakes import token_rollout  # noqa: E402

from carl.systems.cpu_ranks import run_on_cpu_ranks  # noqa: E402
from carl.train.config import RLConfig  # noqa: E402
from carl.train.ranks import Ranks, make_optimizer, shard_model  # noqa: E402
from carl.train.step import rl_step  # noqa: E402

STEPS, VOCAB = 3, 96


def _model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _groups(step: int):
    rng = random.Random(step)
    groups = []
    for _ in range(2):
        group = []
        for j in range(4):
            n = rng.randint(6, 14)
            ids = [rng.randrange(1, VOCAB) for _ in range(n)]
            gen = [i >= n // 2 for i in range(n)]
            group.append(token_rollout(ids, gen, reward=float(j % 2), logprob=-rng.uniform(1.0, 4.0)))
        groups.append(group)
    return groups


def _train(rank: int, world: int, optimizer: str, out: str) -> None:
    ranks = Ranks.current()
    model = shard_model(_model(), ranks)
    opt = make_optimizer(optimizer, model, lr=1e-2, weight_decay=0.01, sharded=ranks.world > 1)
    cfg = RLConfig(lr=1e-2, micro_batch_tokens=40, grad_clip=0.5)  # 8 sequences in 3 uneven micro-batches
    losses = []
    for step in range(STEPS):
        m = rl_step(model, opt, None, _groups(step), cfg, None, 0, token_normalizer=64.0, ranks=ranks)
        losses.append((m["loss/total"], m["rl/grad_norm"], m["grpo/num_tokens"]))
    _save_run(model, ranks, losses, out)


def _save_run(model, ranks, losses, out: str) -> None:
    """Rank 0 writes the losses and the full (gathered) weights of a rank run to `out`."""
    if ranks.world > 1:
        from carl.systems.meshes import full_state_dict

        state = full_state_dict(model)
    else:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if ranks.rank == 0:
        torch.save({"losses": losses, "state": state}, out)


@pytest.mark.distributed
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_two_ranks_match_one_rank(optimizer, tmp_path):
    torch.set_num_threads(1)
    _train(0, 1, optimizer, str(tmp_path / "one.pt"))
    run_on_cpu_ranks(_train, 2, optimizer, str(tmp_path / "two.pt"))
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    for (l1, g1, n1), (l2, g2, n2) in zip(one["losses"], two["losses"]):
        assert n1 == n2  # both counted every generated token once
        assert l2 == pytest.approx(l1, rel=1e-4, abs=1e-6) and g2 == pytest.approx(g1, rel=1e-4)
    assert one["state"].keys() == two["state"].keys()
    init = _model().state_dict()
    for name, w in one["state"].items():
        if optimizer == "adamw":
            torch.testing.assert_close(two["state"][name], w, rtol=1e-4, atol=1e-5, msg=name)
        else:
            # Muon orthogonalizes in bf16: the ranks sum a gradient in another order, one element
            # can round to the neighbouring bf16 value, and Newton-Schulz spreads that over the
            # matrix (measured: 0.5% of one matrix's move, every other tensor bit-identical). A
            # wrong shard or a gradient counted twice moves a tensor by ~100% of its move.
            moved = (w - init[name]).norm()
            assert (two["state"][name] - w).norm() <= 0.02 * moved + 1e-6, name
    moved = sum(float((w - init[n]).abs().sum()) for n, w in one["state"].items())
    assert moved > 0  # the steps changed the weights


def test_the_micro_batches_of_a_rank_are_its_share_padded_to_equal_length():
    assert Ranks(0, 2).share([1, 2, 3]) == [1, 3]
    assert Ranks(1, 2).share([1, 2, 3]) == [2, None]
    assert Ranks(0, 1).share([1, 2]) == [1, 2]


def _sd_model(tokenizer) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _train_sd_kl(rank: int, world: int, out: str) -> None:
    """3 steps with self-distillation and the KL penalty: groups of one solved and one failed
    recorded rollout (the failed one's error turns are the teacher contexts), unevenly spread over
    micro-batches, so that ranks differ in which micro-batches have teacher turns."""
    from tiny_hf import tiny_tokenizer
    from train_fakes import TOOLS, failed_rollout, solved_rollout

    from carl.train.reference import FullReference

    tok = tiny_tokenizer()
    ranks = Ranks.current()
    model = shard_model(_sd_model(tok), ranks)
    reference = _sd_model(tok).requires_grad_(False)
    reference = FullReference(shard_model(reference, ranks) if ranks.world > 1 else reference)
    opt = make_optimizer("adamw", model, lr=1e-2, weight_decay=0.0, sharded=ranks.world > 1)
    cfg = RLConfig(lr=1e-2, micro_batch_tokens=160, grad_clip=0.5, sd_weight=0.5, kl_coef=0.1, route_by_outcome=False)
    groups = [[solved_rollout(tok), failed_rollout(tok)], [failed_rollout(tok), solved_rollout(tok)],
              [solved_rollout(tok), failed_rollout(tok)]]
    losses = []
    for _ in range(STEPS):
        m = rl_step(model, opt, None, groups, cfg, tok, tok.pad_token_id, 64.0, reference=reference,
                    valid_tools=TOOLS, ranks=ranks)
        losses.append((m["loss/grpo"], m["loss/kl"], m["loss/self_distill"], m["rl/grad_norm"]))
    _save_run(model, ranks, losses, out)


@pytest.mark.distributed
def test_self_distillation_and_kl_on_two_ranks_match_one_rank(tmp_path):
    torch.set_num_threads(1)
    _train_sd_kl(0, 1, str(tmp_path / "one.pt"))
    run_on_cpu_ranks(_train_sd_kl, 2, str(tmp_path / "two.pt"))
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert all(sd > 0 for _, _, sd, _ in one["losses"])  # self-distillation ran
    assert any(kl != 0 for _, kl, _, _ in one["losses"][1:])  # the policy left the reference
    for a, b in zip(one["losses"], two["losses"]):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6)
    for name, w in one["state"].items():
        torch.testing.assert_close(two["state"][name], w, rtol=1e-4, atol=1e-5, msg=name)


_LEAVE_SCRIPT = """
import time, torch, torch.distributed as dist
from carl.train.ranks import exit_follower, torchrun_ranks
try:
    with torchrun_ranks() as ranks:
        box = [("op", [1, 2]) if ranks.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        dist.all_reduce(torch.ones(8))
        if ranks.rank == 0:
            time.sleep(0.5)  # rank 1 leaves and exits first, as `carl train`'s followers do
            raise KeyError("rank 0 fails")
except KeyError:
    pass
print(f"rank {ranks.rank} of {ranks.world}: group up after: {dist.is_initialized()}")
if ranks.rank > 0:
    exit_follower(0)  # as the `carl` command ends a follower
"""


@pytest.mark.distributed
def test_torchrun_ranks_leave_the_group_on_return_and_on_error(tmp_path):
    """Each rank destroys its process group on the way out of `torchrun_ranks` (rank 0 by an error),
    and the follower, ended by `exit_follower`, exits 0 with what it printed flushed."""
    import os
    import subprocess

    (tmp_path / "leave.py").write_text(_LEAVE_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(tmp_path / "leave.py")]
    res = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(res.stdout.split("\n")[:-1]) == [f"rank {r} of 2: group up after: False" for r in (0, 1)]


@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_carl_train_runs_on_two_torchrun_ranks_and_resumes_on_one(one_task, tmp_path):
    """`torchrun --nproc-per-node 2 -m carl.cli train ...` on CPU (gloo): warm start, RL steps and evals
    with the model sharded over both ranks (and the KL reference, and self-distillation on); its
    checkpoint (the optimizer's state in DCP shards) then resumes on one rank."""
    import json
    import os
    import subprocess

    from tiny_hf import save_tiny_model
    from tiny_run import tiny_train_overrides

    from carl.config import load_config, save_config
    from carl.train.config import TrainConfig

    model = save_tiny_model(tmp_path / "tiny")
    overrides = tiny_train_overrides(
        tmp_path / "run", model, one_task, "model.trainable_layers=0", "rl.steps=2", "rollout.max_extra_batches=0",
        "rl.micro_batch_tokens=2000", "rl.kl_coef=0.05", "rl.sd_weight=0.5", "checkpoint_optimizer=sharded")
    save_config(load_config(TrainConfig, None, overrides), tmp_path / "cfg.toml")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "carl.cli", "train", str(tmp_path / "cfg.toml")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2]
    assert all("kl/kl" in r for r in rows if "rl/reward_mean" in r)  # the sharded KL reference ran
    assert "sharded over 2 ranks" in res.stdout
    assert (run / "checkpoints" / "step_000002" / "optimizer" / ".metadata").is_file()  # DCP shards of 2 ranks
    assert json.loads((run / "report.json").read_text()).keys() == {"warm_start", "rl"}
    # the 2-rank checkpoint trains on on one rank (the same checkpoint format)
    one = [sys.executable, "-m", "carl.cli", "train", str(run / "config.toml"), "rl.steps=3", "--extend"]
    res = subprocess.run(one, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2, 3]


@pytest.mark.parametrize("checkpoint_optimizer", ["full", "sharded"])
def test_a_checkpoint_resumes_to_the_same_weights_as_training_on(checkpoint_optimizer, tmp_path):
    """Exact resume through Trainer.save / Trainer.load, with the optimizer state in trainer.pt
    ("full") or in torch.distributed.checkpoint shards ("sharded", <checkpoint>/optimizer/)."""
    from tiny_hf import save_tiny_model

    from carl.config import load_config
    from carl.train.checkpoint import latest_checkpoint
    from carl.train.config import TrainConfig
    from carl.train.state import RunState
    from carl.train.trainer import Trainer

    torch.set_num_threads(1)
    model = save_tiny_model(tmp_path / "tiny")
    cfg = load_config(TrainConfig, None, [f"model.path={model}", "model.dtype=float32", "model.trainable_layers=0",
                                          f"checkpoint_optimizer={checkpoint_optimizer}", "rl.lr=1e-2"])

    def step(trainer, i):
        return trainer.rl_step(_groups(i), 64.0, (), 0)["loss/total"]

    straight = Trainer(cfg, model)
    want = [step(straight, i) for i in range(3)]
    first = Trainer(cfg, model)
    [step(first, i) for i in range(2)]
    first.save(tmp_path / "run", 2, RunState(phase="rl", rl_step=2))
    ckpt = latest_checkpoint(tmp_path / "run")
    assert (ckpt / "optimizer").is_dir() == (checkpoint_optimizer == "sharded")
    resumed = Trainer(cfg, model)
    assert resumed.load(ckpt).rl_step == 2
    assert step(resumed, 2) == pytest.approx(want[2], rel=1e-6)
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert not list((tmp_path / "run" / "checkpoints").glob("*.tmp-*"))


_FOLLOWER_SCRIPT = """
import atexit, sys
atexit.register(lambda: print("interpreter teardown ran"))
from carl.cli import main
sys.exit(main(["train", "/nonexistent/cfg.toml"]))
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_the_carl_command_ends_a_torchrun_follower_without_interpreter_teardown(rank, tmp_path):
    """Under torchrun (WORLD_SIZE > 1), ranks 1..N-1 leave through `exit_follower`: the command's exit
    code and its flushed output, no teardown (where gloo's threads can abort the process); rank 0
    and single processes exit normally."""
    import os
    import subprocess

    env = {**os.environ, "WORLD_SIZE": "2", "RANK": str(rank)}
    res = subprocess.run([sys.executable, "-c", _FOLLOWER_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2  # the config error's code, from either path
    assert "config file '/nonexistent/cfg.toml' does not exist" in res.stderr
    assert ("interpreter teardown ran" in res.stdout) == (rank == 0)
