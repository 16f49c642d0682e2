"""`carl.train.loop.train` end to end on a tiny random model and one validated micro task:
warm start -> eval -> RL step -> eval -> report, the pinned warm-start checkpoint, and a rerun
that resumes from the finished state instead of training again."""

import io
import json
import re
from dataclasses import replace

import pytest
import torch
from benchmark_modules import load
from rich.console import Console
from tiny_hf import save_tiny_model
from tiny_run import tiny_train_overrides

from carl.config import ConfigError, load_config
from carl.micro.generate import package_name
from carl.micro.world import split_seeds
from carl.train.config import TrainConfig
from carl.train.loop import train


def _cfg(tmp_path, one_task, *extra):
    model = save_tiny_model(tmp_path / "tiny")
    return load_config(TrainConfig, None, tiny_train_overrides(tmp_path / "run", model, one_task, *extra))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, one_task):
    """One finished run (warm start, RL step 1 with a KL reference and the failed-call cost, two
    evals) for the tests that only read it or branch from it: (config, summary, run_dir)."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("finished")
    cfg = _cfg(tmp, one_task, "rl.kl_coef=0.1", "shaping.tool_error_cost=0.1")  # the reference loads from step 0
    return cfg, train(cfg, Console(quiet=True)), tmp / "run"


def test_train_runs_warm_start_rl_and_eval_and_a_rerun_resumes_finished(finished):
    cfg, summary, run = finished
    assert set(summary) == {"warm_start", "rl"}
    assert summary["rl"]["num_tasks"] == 1 and summary["rl"]["k"] == 1
    assert json.loads((run / "report.json").read_text()) == json.loads(json.dumps(summary))
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000000", "step_000001"]  # the warm start is pinned
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("loss/sft" in r for r in rows) and any("rl/reward_mean" in r for r in rows)
    assert any("eval/pass@1" in r for r in rows)
    rl_row = next(r for r in rows if "rl/reward_mean" in r)  # an all-0 first batch is followed by one more
    assert rl_row["rl/batches"] == 2 or 0 < rl_row["rl/reward_mean"] < 1, rl_row
    assert rl_row["loss/kl"] == 0.0 and abs(rl_row["kl/kl"]) < 1e-4  # one step: the policy is still the reference
    assert (run / "config.toml").exists() and list((run / "plots").glob("*.png"))
    evals = sorted(p.name for p in (run / "transcripts").glob("step*_eval_*.txt"))
    assert [n[:19] for n in evals] == ["step00000_eval_000_", "step00001_eval_000_"]  # warm start, after RL
    assert "Stubbed:" in (run / "transcripts" / evals[0]).read_text()
    reports = sorted(p.name for p in (run / "eval").glob("step*.json"))  # per-task results of each eval
    assert reports == ["step000000.json", "step000001.json"]
    rl_report = json.loads((run / "eval" / reports[1]).read_text())
    assert rl_report["summary"] == json.loads(json.dumps(summary["rl"]))
    assert [t["n"] for t in rl_report["tasks"]] == [1] and rl_report["tasks"][0]["passed"] in (0, 1)
    (first,) = json.loads((run / "time.json").read_text())["processes"]  # where the run's time went
    groups = [p["group"] for p in first["phases"]]
    assert groups[:1] == ["expert episodes"] and {"warm start", "eval warm start", "RL", "eval after RL"} <= set(groups)
    assert len(groups) == len(set(groups))  # the epochs of the warm start and the RL steps count as one each
    assert 0 < sum(p["wall_s"] for p in first["phases"]) <= first["total_s"]
    # a finished run resumes at phase "done": same report, no new RL step
    again = train(cfg, Console(quiet=True))
    assert again == summary
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(rows)
    assert len(json.loads((run / "time.json").read_text())["processes"]) == 2  # the resumed process's own entry


def test_rl_steps_0_is_a_warm_start_evaluated_once_and_a_branch_of_it_trains(tmp_path, one_task, capsys):
    torch.set_num_threads(1)
    summary = train(_cfg(tmp_path, one_task, "rl.steps=0"), Console(quiet=True))
    run = tmp_path / "run"
    assert set(summary) == {"warm_start"}  # no RL step: no rollout, no second eval of the same weights
    assert sorted(p.name for p in (run / "eval").glob("step*.json")) == ["step000000.json"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not any("rl/reward_mean" in r for r in rows)
    from carl.cli import main as carl

    branch = tmp_path / "branch"  # the run's own config.toml names the tiny model and the tasks
    assert carl(["train", str(run / "config.toml"), f"run_dir={branch}", "rl.steps=1", "--branch-from", f"{run}:0"]) == 0
    assert set(json.loads((branch / "report.json").read_text())) == {"warm_start", "rl"}
    assert "RL - warm start on 1 held-out tasks" in capsys.readouterr().out
    # a branch with other eval settings evaluates the warm start again under its own, once
    again = tmp_path / "reeval"
    assert carl(["train", str(run / "config.toml"), f"run_dir={again}", "eval.samples_per_task=2",
                 "--branch-from", str(run)]) == 0
    out = capsys.readouterr().out
    assert "evaluated again" in out and "eval.samples_per_task: 1 -> 2" in out
    assert [t["n"] for t in json.loads((again / "eval" / "step000000.json").read_text())["tasks"]] == [2]
    rows = [json.loads(line) for line in (again / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0]
    assert json.loads((again / "report.json").read_text())["warm_start"]["k"] == 2


def test_rl_tasks_without_tasks_is_a_config_error(tmp_path, one_task):
    cfg = load_config(TrainConfig, None, [f"run_dir={tmp_path}", f"rl_tasks={one_task}"])
    with pytest.raises(ConfigError, match="rl_tasks"):
        train(cfg, Console(quiet=True))


def test_micro_splits_use_disjoint_generator_seeds():
    all_seeds = [s for world in (0, 1) for split in ("warm_start", "rl", "eval") for s in split_seeds(split, world, 50)]
    assert len(all_seeds) == len(set(all_seeds)) == 300
    names = [package_name(s) for s in all_seeds]
    assert len(set(names)) == len(names), "every repo of two worlds has its own package name"
    assert all(re.fullmatch(r"[a-z]+_[a-z]+[0-9]", n) for n in names)
    with pytest.raises(ValueError, match="split"):
        split_seeds("train", 0, 1)
    with pytest.raises(ValueError, match="rl repos"):
        split_seeds("rl", 0, 501)


def test_a_crash_before_the_rl_checkpoint_resumes_from_step_0_and_logs_the_step_once(tmp_path, one_task, monkeypatch):
    torch.set_num_threads(1)
    cfg = _cfg(tmp_path, one_task)
    from carl.train import trainer as trainer_module

    real_save = trainer_module.save_checkpoint

    def crash_at_step_1(run_dir, step, *args, **kwargs):
        if step == 1:
            raise OSError(28, "No space left on device")  # as a full disk did mid-run
        return real_save(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_checkpoint", crash_at_step_1)
    with pytest.raises(OSError, match="No space"):
        train(cfg, Console(quiet=True))
    run = tmp_path / "run"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps.count(1) == 1 and (run / "checkpoints" / "latest").read_text().strip() == "step_000000"
    monkeypatch.setattr(trainer_module, "save_checkpoint", real_save)
    summary = train(cfg, Console(quiet=True))  # resumes at RL step 0 and runs step 1 again
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1]  # not twice
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 1]
    assert json.loads((run / "report.json").read_text()) == json.loads(json.dumps(summary))


@pytest.mark.parametrize("budget", ["rl.max_wall_s=0.001", "rl.max_rollouts=2"])
def test_an_rl_budget_stops_after_the_step_that_reaches_it_then_evaluates_and_a_rerun_trains_no_more(
        tmp_path, one_task, budget, monkeypatch):
    import carl.train.loop as loop_module

    torch.set_num_threads(1)
    started = []  # RL episodes started: none may start for a step the run does not take
    real_rollout = loop_module.run_rollout
    monkeypatch.setattr(loop_module, "run_rollout", lambda *a, **k: started.append(1) or real_rollout(*a, **k))
    cfg = _cfg(tmp_path, one_task, "rl.steps=3", budget, "rollout.concurrency=1",
               "checkpoint_every=5")  # only the stop itself checkpoints step 1
    out = io.StringIO()
    summary = train(cfg, Console(file=out, width=300))
    if budget.startswith("rl.max_rollouts"):  # said at RL's start: the budget, not rl.steps, ends RL
        assert ("RL: rl.max_rollouts=2 leaves room for at most 1 more of rl.steps=3 steps (2 rollouts left, "
                "2 a step); rl.max_rollouts=0 removes the limit") in out.getvalue()
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1]  # 1 of 3 steps
    step1 = next(r for r in rows if "rl/reward_mean" in r)
    assert step1["rl/rollouts_total"] == 2 * step1["rl/batches"]  # groups of 2, one task per batch
    assert len(started) == step1["rl/rollouts_total"]
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 1]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000000", "step_000001"]
    assert set(summary) == {"warm_start", "rl"}
    assert train(cfg, Console(quiet=True)) == summary  # finished: no more RL steps on a rerun
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(rows)
    # benchmarks/learning.py's continue_rl reopens it: RL trains on to rl.steps and is evaluated again
    learning = load("learning")
    if budget.startswith("rl.max_rollouts"):  # reopened under the same rollout budget: no step, said why
        assert learning.continue_rl(run, 3) == 1
        out = io.StringIO()
        train(cfg, Console(file=out, width=200))
        assert ("RL: no step after step 1: rl.max_rollouts=2 reached (2 rollouts); raise rl.max_rollouts "
                "(0: no limit) to train on") in out.getvalue()
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1]
    cfg = _cfg(tmp_path, one_task, "rl.steps=3", "rollout.concurrency=1", "checkpoint_every=5")
    assert learning.continue_rl(run, cfg.rl.steps) == 1
    assert not (run / "report.json").exists() and not (run / "eval" / "step000001.json").exists()
    started.clear()
    longer = train(cfg, Console(quiet=True))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2, 3]
    step3 = [r for r in rows if "rl/reward_mean" in r][-1]
    assert len(started) == step3["rl/rollouts_total"] - step1["rl/rollouts_total"]  # none past step 3
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 3]  # step 1's eval went with its report
    assert sorted(p.name for p in (run / "eval").glob("step*.json")) == ["step000000.json", "step000003.json"]
    assert longer["warm_start"] == summary["warm_start"] and json.loads((run / "report.json").read_text()) == longer
    assert learning.continue_rl(run, cfg.rl.steps) is None and (run / "report.json").exists()  # ran 3 already


def test_budget_spent_names_the_budget_that_ended_rl():
    from carl.train.loop import budget_batches, budget_spent
    from carl.train.state import RunState

    both = load_config(TrainConfig, None, ["rl.max_wall_s=60", "rl.max_rollouts=96"])
    assert budget_spent(both, RunState(rl_rollouts=95), 59.0) == ""
    assert budget_spent(both, RunState(rl_rollouts=104), 1.0) == "rl.max_rollouts=96 reached (104 rollouts)"
    assert budget_spent(both, RunState(rl_rollouts=0), 60.0) == "rl.max_wall_s=60 s reached"
    unlimited = load_config(TrainConfig, None, ["rl.max_rollouts=0"])
    assert budget_spent(unlimited, RunState(rl_rollouts=10**6), 1e9) == ""  # 0: no limit
    assert budget_spent(load_config(TrainConfig, None, []), RunState(rl_rollouts=64), 1.0) == \
        "rl.max_rollouts=64 reached (64 rollouts)"  # the default's budget
    # batches of 2 tasks x 4: 96 - 80 = 16 rollouts left is 2 batches, 1 left is still 1, no budget None
    assert [budget_batches(both, RunState(rl_rollouts=n)) for n in (80, 95, 96)] == [2, 1, 1]
    assert budget_batches(unlimited, RunState()) is None


def test_step_label_bounds_the_steps_left_by_the_rollout_budget():
    from carl.train.loop import step_label
    from carl.train.state import RunState

    budget = load_config(TrainConfig, None, ["rl.steps=30", "rl.max_rollouts=64", "rollout.tasks_per_step=2",
                                             "rollout.group_size=8"])  # 16 rollouts a batch: at most 4 steps
    assert step_label(budget, RunState(), 1) == "RL step 1/at most 4"
    # step 1 drew 2 batches (dynamic sampling): 32 left, so at most 2 more steps
    assert step_label(budget, RunState(rl_step=1, rl_rollouts=32), 2) == "RL step 2/at most 3"
    assert step_label(budget, RunState(rl_step=3, rl_rollouts=60), 4) == "RL step 4/at most 4"  # 4 left: one batch
    plain = load_config(TrainConfig, None, ["rl.steps=8"])
    assert step_label(plain, RunState(rl_step=2), 3) == "RL step 3/8"
    roomy = load_config(TrainConfig, None, ["rl.steps=3", "rl.max_rollouts=1000"])  # the step count ends RL first
    assert step_label(roomy, RunState(), 1) == "RL step 1/3"


@pytest.mark.parametrize("override, field", [("rollout.concurrency=0", "rollout.concurrency"),
                                             ("rl.max_wall_s=-1", "rl.max_wall_s"),
                                             ("rl.max_rollouts=-4", "rl.max_rollouts")])
def test_bad_concurrency_or_wall_budget_is_a_config_error_naming_the_field(override, field):
    with pytest.raises(ValueError, match=field):  # the CLI prints it as one "config error" line
        load_config(TrainConfig, None, [override])


def test_async_rl_with_staleness_1_trains_within_the_bound_and_logs_it(tmp_path, one_task):
    torch.set_num_threads(1)
    import io
    import re

    cfg = _cfg(tmp_path, one_task, "rl.steps=3", "rollout.max_staleness=1", "rollout.max_extra_batches=0")
    out = io.StringIO()
    train(cfg, Console(file=out, width=200))
    counts = [tuple(map(int, m)) for m in re.findall(r"\[progress\] RL step \d/3: (\d+)/(\d+) rollouts", out.getvalue())]
    assert counts and all(done <= total for done, total in counts), counts  # rollouts run ahead grow the total
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if "rl/reward_mean" in r]
    assert [r["step"] for r in rl] == [1, 2, 3]
    for r in rl:
        assert 0.0 <= r["staleness/token_mean"] <= r["staleness/token_max"] <= 1.0
        assert r["rl/groups_dropped"] == 0.0 and 0.0 <= r["time/trainer_idle_frac"] <= 1.0
        assert "mismatch/abs_diff_mean" in r and r["sync/bytes"] > 0 and r["sync/snapshot"] in (0.0, 1.0)


def test_sigkill_of_the_trainer_mid_rl_resumes_to_one_row_per_step(tmp_path, one_task):
    """`kill -9` of `carl train` after its first RL checkpoint: a rerun resumes there, and the metrics
    series has each step once (the killed step's half-written rows are dropped)."""
    import signal
    import subprocess
    import sys
    import time

    cfg = _cfg(tmp_path, one_task, "rl.steps=4", "rollout.max_staleness=1")
    from carl.config import save_config

    save_config(cfg, tmp_path / "cfg.toml")
    cmd = [sys.executable, "-m", "carl.cli", "train", str(tmp_path / "cfg.toml")]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    mid_rl = {f"step_{s:06d}" for s in (1, 2, 3)}  # an RL checkpoint with RL steps still to run
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (latest.exists() and latest.read_text().strip() in mid_rl):
        assert proc.poll() is None, "carl train ended before it was killed mid-RL"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 4]


def test_branch_from_and_extend_are_train_options(tmp_path, finished, capsys):
    from carl.cli import main
    from carl.config import save_config

    torch.set_num_threads(1)
    cfg, _, first = finished
    episodes = cfg.warm_start.episodes  # a config whose warm start is not the source's: the branch records the source's
    save_config(replace(cfg, warm_start=replace(cfg.warm_start, episodes=episodes + 5)), tmp_path / "cfg.toml")
    branch = tmp_path / "branch"
    args = ["train", str(tmp_path / "cfg.toml"), f"run_dir={branch}", "rl.lr=5e-5", "shaping.cost_needs_pass=true",
            "--branch-from", f"{first}:0"]
    assert main(args[:3] + ["warm_start.lr=0.1"] + args[3:]) == 2  # on the command line: refused, before any work
    assert "warm_start.lr: a branch starts from" in capsys.readouterr().err and not branch.exists()
    assert main(args) == 0
    assert f"warm_start.episodes: {episodes} -> {episodes + 5}" in capsys.readouterr().out
    assert load_config(TrainConfig, branch / "config.toml").warm_start == cfg.warm_start
    rows = [json.loads(line) for line in (branch / "metrics.jsonl").read_text().splitlines()]
    assert not any("loss/sft" in r for r in rows[len([r for r in rows if r["step"] <= 0]):])  # no new warm start
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1]
    assert "cost_needs_pass = true" in (branch / "config.toml").read_text()  # a shaping option a branch may change
    assert (branch / "eval" / "step000000.json").read_bytes() == (first / "eval" / "step000000.json").read_bytes()
    assert main(["train", str(branch / "config.toml"), "rl.steps=2", "--extend"]) == 0
    rows = [json.loads(line) for line in (branch / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "rl/reward_mean" in r] == [1, 2]
    assert main(["train", str(branch / "config.toml"), "--branch-from", str(branch)]) == 2  # its own run_dir
    assert "own run_dir" in capsys.readouterr().err
