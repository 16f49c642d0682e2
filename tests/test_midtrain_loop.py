"""`carl midtrain` end to end on a tiny random model and a tiny repository: the loss falls, a crash
(an exception, or kill -9) resumes to the same metrics and weights, 2 gloo ranks give 1 rank's
losses, the checkpoint is a Hugging Face folder, and config errors say what was wrong."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))

from tiny_hf import save_tiny_model  # noqa: E402

from carl.config import ConfigError, load_config, save_config  # noqa: E402
from carl.errors import UserError  # noqa: E402
from carl.midtrain import loop as loop_module  # noqa: E402
from carl.midtrain.config import MidtrainConfig  # noqa: E402
from carl.midtrain.loop import midtrain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("train/tokens_per_s", "time/step_s", "time/eval_s")  # wall-clock metrics: differ between runs


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A tiny random model, a small repository (a few modules of similar functions) and general data."""
    root = tmp_path_factory.mktemp("midtrain")
    save_tiny_model(root / "model")
    for i in range(8):
        body = "".join(f"def add_{i}_{j}(a, b):\n    return a + b + {j}\n\n" for j in range(12))
        path = root / "repo" / "pkg" / f"mod{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    for i in range(6):
        path = root / "general" / f"g{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"class C{j}:\n    size = {j}\n" for j in range(8 + i)))
    return root


@pytest.fixture(scope="module")
def whole(world, tmp_path_factory) -> Path:
    """The run directory of an uninterrupted run of `_cfg`'s defaults (6 steps, checkpoints every 2, evals every 3)."""
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    midtrain(_cfg(world, run_dir), Console(quiet=True))
    return run_dir


def _cfg(world: Path, run_dir: Path, *overrides: str) -> MidtrainConfig:
    return load_config(MidtrainConfig, None, [
        f"run_dir='{run_dir}'", f"model.path='{world / 'model'}'", "model.dtype='float32'",
        f"data.sources=['{world / 'repo'}']", f"data.general.path='{world / 'general'}'", "data.general.share=0.2",
        "data.heldout_fraction=0.25", "data.seq_len=64", "steps=6", "batch_size=3", "micro_batch_size=1",
        "optim.lr=3e-3", "optim.warmup_steps=1", "checkpoint_every=2", "eval_every=3", *overrides])


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(ckpt / "model" / "model.safetensors")


def test_the_loss_falls_and_the_checkpoint_is_a_hugging_face_model(world, tmp_path):
    from carl.engine.hf import load_model

    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    report = midtrain(_cfg(world, run_dir, "steps=8", "checkpoint_every=4"), Console(quiet=True))
    rows = _rows(run_dir)
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 8 and losses[-1] < 0.7 * losses[0]
    assert report["after"]["heldout/trained"] < report["before"]["heldout/trained"] - 1.0  # nats per token
    assert set(report["before"]) == {"heldout/trained", "heldout/general", "heldout/source/repo"}
    per_file = json.loads((run_dir / "eval" / "step000008.json").read_text())["files"]
    assert per_file and all(f["tokens"] > 0 and f["loss"] > 0 for f in per_file)
    assert {p.name for p in (run_dir / "plots").glob("*.png")} >= {"loss.png", "lr.png", "throughput.png"}
    assert (run_dir / "report.json").is_file() and (run_dir / "git_revision.txt").is_file()

    tokenizer, model = load_model(run_dir / "checkpoints" / "step_000008" / "model", torch.float32)
    saved = _weights(run_dir / "checkpoints" / "step_000008")
    for name, w in model.state_dict().items():
        torch.testing.assert_close(w, saved[name])
    assert model(input_ids=torch.tensor([tokenizer("def add(a, b):")["input_ids"]])).logits.isfinite().all()

    # the run trains on the data it prepared: another data config in its run_dir is an error, not a mix
    with pytest.raises(UserError, match="holds data prepared for another data config"):
        midtrain(_cfg(world, run_dir, "steps=8", "checkpoint_every=4", "data.heldout_fraction=0.5"), Console(quiet=True))


def test_a_crash_resumes_to_the_same_metrics_and_weights(world, whole, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    crashed = tmp_path / "crashed"
    real_save = loop_module.save

    def crash_at_step_4(run_dir, model, tokenizer, optimizer, ranks, state, keep):
        if state.step == 4:  # steps 3 and 4 are logged, their checkpoint is not written
            raise RuntimeError("killed")
        real_save(run_dir, model, tokenizer, optimizer, ranks, state, keep)

    monkeypatch.setattr(loop_module, "save", crash_at_step_4)
    with pytest.raises(RuntimeError, match="killed"):
        midtrain(_cfg(world, crashed), Console(quiet=True))
    assert [r["step"] for r in _rows(crashed)] == [0, 1, 2, 3, 3, 4]  # step 3: a train row and an eval row
    monkeypatch.setattr(loop_module, "save", real_save)
    midtrain(_cfg(world, crashed), Console(quiet=True))  # resumes from step 2

    assert _rows(crashed) == _rows(whole)  # each step once, the same values
    w_whole, w_crashed = _weights(whole / "checkpoints" / "step_000006"), _weights(crashed / "checkpoints" / "step_000006")
    assert all(torch.equal(w_whole[k], w_crashed[k]) for k in w_whole)


def test_kill_9_of_the_command_resumes_to_the_same_metrics(world, whole, tmp_path):
    """`kill -9` of `python -m carl.commands.midtrain` once it has written a checkpoint (wherever it is by
    then: training, evaluating or writing the next one); the rerun resumes and logs each step once,
    with the values of the uninterrupted run."""
    save_config(_cfg(world, tmp_path / "run"), tmp_path / "cfg.toml")
    cmd = [sys.executable, "-m", "carl.commands.midtrain", str(tmp_path / "cfg.toml")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not latest.exists():
        assert proc.poll() is None, "carl midtrain ended before a checkpoint was seen"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert not (tmp_path / "run" / "report.json").exists()

    torch.set_num_threads(1)
    midtrain(load_config(MidtrainConfig, tmp_path / "cfg.toml"), Console(quiet=True))  # the rerun, in this process
    resumed, expected = _rows(tmp_path / "run"), _rows(whole)
    assert [r["step"] for r in resumed] == [r["step"] for r in expected] == [0, 1, 2, 3, 3, 4, 5, 6, 6]
    for a, b in zip(resumed, expected):
        assert a.keys() == b.keys()
        assert all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a)


def _midtrain_on_rank(rank: int, world_size: int, cfg_path: str) -> None:
    midtrain(load_config(MidtrainConfig, cfg_path), Console(quiet=True))


@pytest.mark.distributed
def test_two_gloo_ranks_give_the_losses_and_weights_of_one_rank(world, tmp_path):
    from carl.systems.cpu_ranks import run_on_cpu_ranks

    torch.set_num_threads(1)
    # 3 rows a step in micro-batches of 1: rank 0 runs two, rank 1 one and an idle one
    midtrain(_cfg(world, tmp_path / "one", "steps=3", "eval_every=0"), Console(quiet=True))
    save_config(_cfg(world, tmp_path / "two", "steps=3", "eval_every=0"), tmp_path / "two.toml")
    run_on_cpu_ranks(_midtrain_on_rank, 2, str(tmp_path / "two.toml"))
    one, two = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3, 3]
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        assert all(b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6) for k in a)
    w_one, w_two = _weights(tmp_path / "one" / "checkpoints" / "step_000003"), \
        _weights(tmp_path / "two" / "checkpoints" / "step_000003")
    for name, w in w_one.items():
        torch.testing.assert_close(w_two[name], w, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("override, message", [
    ("data.sources=[]", r"data.sources: got \[\], expected at least one directory"),
    ("data.general.share=1.5", r"data.general.share: got 1.5, expected a fraction in \[0, 1\)"),
    ("optim.name='sgd'", r"optim.name: got 'sgd', expected one of \['adamw', 'muon'\]"),
    ("model.lora_rank=8", r"model.lora_rank: got 8, expected 0"),
    ("steps=0", r"steps: got 0, expected >= 1"),
    ("data.sourcs=['x']", r"data.sourcs: unknown field of DataConfig; expected one of: .*sources"),
    ("data.seq_len='long'", r"data.seq_len: got 'long', expected an integer"),
])
def test_config_errors_name_the_field_the_value_and_what_was_expected(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(MidtrainConfig, None, ["data.sources=['.']", override])


def test_the_shipped_configs_parse_and_name_valid_sources():
    from carl.midtrain.data import check_sources

    paths = sorted((ROOT / "configs").glob("midtrain*.toml"))
    assert paths
    for path in paths:
        check_sources(load_config(MidtrainConfig, path).data)


def test_the_command_line_reports_a_bad_config_or_source_in_one_line(tmp_path):
    import argparse

    from carl.commands.midtrain import run

    with pytest.raises(UserError, match=r"expected pypi:NAME==VERSION"):  # before any model or data work
        run(argparse.Namespace(args=[f"run_dir='{tmp_path}'", "data.sources=['pypi:toolz']"]))
    with pytest.raises(ConfigError, match=r"data.sources: got \[\], expected at least one"):
        run(argparse.Namespace(args=["steps=2"]))
    out = subprocess.run([sys.executable, "-m", "carl.commands.midtrain", "steps=-1", "data.sources=['.']"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == "carl: config error: steps: got -1, expected >= 1"
