"""`carl eval --checkpoint DIR --tasks FILE`: a tiny model's training checkpoint on one real micro task
(generated repo -> feature deletion -> validation, local sandbox) writes the JSON report."""

import json

import pytest
import torch
from tiny_hf import save_tiny_model

from carl.cli import main
from carl.engine.hf import load_model
from carl.train.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def micro_tasks(tmp_path_factory):
    """One held-out micro task (~10-20 s: shared by the tests of this module)."""
    from carl.micro.world import build_micro_tasks

    out = tmp_path_factory.mktemp("micro")
    world = build_micro_tasks(out, seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=1, backend="local")
    assert len(world["eval"]) == 1
    return out / "eval.jsonl"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    tokenizer, model = load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")), torch.float32)
    run_dir = tmp_path_factory.mktemp("run")
    return save_checkpoint(run_dir, 3, model, tokenizer, None, None, {"rl_step": 3})


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_eval_writes_the_json_report(micro_tasks, checkpoint, tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--sandbox", "local",
                 "--samples", "2", "--max-turns", "2", "--max-new-tokens", "16", "--tools", "read_file,finish",
                 "--temperature", "1.0", "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert s["name"] == "step_000003" and s["num_tasks"] == 1 and s["k"] == 2
    for key in ("pass@1", "pass@2", "tokens_per_task", "tool_calls_per_task", "wall_s_per_task", "infra_failures"):
        assert key in s, key
    assert s["infra_failures"] == 0, report
    assert 0.0 <= s["pass@1"] <= s["pass@2"] <= 1.0
    assert s["tokens_per_task"] > 0 and s["wall_s_per_task"] > 0  # the tiny model really sampled
    (task,) = report["tasks"]
    assert task["n"] == 2 and task["mean_tokens"] <= 2 * 16  # at most max_turns x max_new_tokens
    assert "pass@1" in capsys.readouterr().out  # the table


def test_eval_rejects_a_folder_without_a_model(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", str(tasks)]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_eval_rejects_a_missing_task_file(tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", str(tmp_path / "nope.jsonl")]) == 2
    assert "--tasks" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_eval_with_a_run_config_scores_as_that_run_and_flags_still_win(micro_tasks, checkpoint, tmp_path):
    from carl.config import load_config, save_config
    from carl.train.config import TrainConfig

    run_cfg = tmp_path / "config.toml"
    save_config(load_config(TrainConfig, None, [
        "limits.max_turns=1", "limits.max_new_tokens=8", "eval.samples_per_task=3", "eval.temperature=1.0",
        "sandbox.backend=local", "model.dtype=float32", "tools=[\"read_file\", \"finish\"]"]), run_cfg)
    out = tmp_path / "report.json"
    assert main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--run-config", str(run_cfg),
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["summary"]["k"] == 3  # the run's eval.samples_per_task
    (task,) = report["tasks"]
    assert task["n"] == 3 and 0 < task["mean_tokens"] <= 8  # one turn of at most 8 tokens: the run's limits
    assert main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--run-config", str(run_cfg),
                 "--samples", "1", "--max-new-tokens", "4", "--out", str(out)]) == 0
    (task,) = json.loads(out.read_text())["tasks"]
    assert task["n"] == 1 and task["mean_tokens"] <= 4
    assert main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--run-config", str(run_cfg),
                 "--samples", "1", "--wall-time-s", "1e-9", "--out", str(out)]) == 0
    (task,) = json.loads(out.read_text())["tasks"]
    assert task["stop_reasons"] == {"wall_time": 1}  # the flag's limit, not the run's


def test_a_runs_eval_wall_time_replaces_its_episode_limit_in_evals_only():
    from carl.config import load_config
    from carl.train.config import TrainConfig
    from carl.train.loop import eval_limits

    run = load_config(TrainConfig, None, ["limits.wall_time_s=300"])
    assert eval_limits(run).wall_time_s == 3600  # the default: one they never reach
    run = load_config(TrainConfig, None, ["limits.wall_time_s=300", "eval.wall_time_s=0"])
    assert eval_limits(run).wall_time_s == 300  # 0: the run's limit
    run = load_config(TrainConfig, None, ["limits.wall_time_s=300", "eval.wall_time_s=7200"])
    assert eval_limits(run).wall_time_s == 7200 and run.limits.wall_time_s == 300
    with pytest.raises(Exception, match="eval.wall_time_s: got -1"):
        load_config(TrainConfig, None, ["eval.wall_time_s=-1"])


def test_eval_rejects_a_wall_time_that_is_not_positive(micro_tasks, tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", str(micro_tasks), "--wall-time-s", "0"]) != 0
    assert "--wall-time-s: got 0, expected a positive number" in capsys.readouterr().err


def test_eval_rejects_a_missing_run_config(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", str(tasks),
                 "--run-config", str(tmp_path / "config.toml")]) == 2
    assert "--run-config" in capsys.readouterr().err


def test_eval_rejects_a_task_file_moved_away_from_its_store(micro_tasks, tmp_path, capsys):
    moved = tmp_path / "eval.jsonl"  # its store (eval.store/) stayed behind: every episode would fail
    moved.write_text(micro_tasks.read_text())
    assert main(["eval", "--checkpoint", str(tmp_path), "--tasks", str(moved)]) == 2
    err = capsys.readouterr().err
    assert "1 of 1 tasks have no broken repo on disk" in err and "eval.store/broken/" in err


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_eval_fails_when_no_sample_could_be_scored_and_says_why(micro_tasks, checkpoint, tmp_path, capsys,
                                                                 monkeypatch):
    from carl.sandbox.base import SandboxError

    def broken(*args, **kwargs):
        raise SandboxError("bwrap: setting up uid map: Permission denied")

    monkeypatch.setattr("carl.rollout.rollout.open_sandbox", broken)
    out = tmp_path / "report.json"
    code = main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--sandbox", "local",
                 "--samples", "2", "--out", str(out)])
    assert code == 1
    printed = capsys.readouterr().out
    assert "no sample was scored" in printed and "2 samples failed in the infrastructure" in printed
    summary = json.loads(out.read_text())["summary"]  # the report is still written, with the reasons
    assert summary["infra_failures"] == 2
    assert summary["infra_errors"] == {"carl.sandbox.base.SandboxError: bwrap: setting up uid map: Permission denied": 2}


@pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")
def test_eval_samples_each_episode_from_its_own_stream_and_repeats(micro_tasks, checkpoint, tmp_path, monkeypatch):
    """Sample j of task t draws from the streams named "t/j" (not from arrival order), so the same
    --seed gives the same episodes (common random numbers across checkpoints)."""
    from carl.engine.hf import HFEngine

    keys: list[str] = []
    episode = HFEngine.episode
    monkeypatch.setattr(HFEngine, "episode", lambda self, key: keys.append(key) or episode(self, key))
    task_id = json.loads(micro_tasks.read_text().splitlines()[0])["instance_id"]
    reports = []
    for i, seed in enumerate(("5", "5", "6")):
        out = tmp_path / f"r{i}.json"
        assert main(["eval", "--checkpoint", str(checkpoint), "--tasks", str(micro_tasks), "--sandbox", "local",
                     "--samples", "3", "--max-turns", "2", "--max-new-tokens", "24", "--tools", "read_file,finish",
                     "--temperature", "1.0", "--seed", seed, "--out", str(out)]) == 0
        reports.append(json.loads(out.read_text())["tasks"][0])
    assert sorted(keys) == sorted([f"{task_id}/{j}" for j in range(3)] * 3)
    for field in ("mean_tokens", "mean_tool_calls", "passed", "outcomes", "digests"):
        assert reports[0][field] == reports[1][field], field
    assert len(reports[0]["outcomes"]) == 3 and len(set(reports[0]["digests"])) == 3  # three different episodes
    assert not set(reports[0]["digests"]) & set(reports[2]["digests"])  # another seed: other episodes
