"""The learning benchmark's statistics: per-task better/worse counts and the paired difference from eval
reports, the per-seed sign test, the spread over seeds (sample sd, t-interval)."""

import json
from pathlib import Path

import pytest
import torch
from benchmark_modules import load
from carl.config import load_config, save_config
from carl.errors import UserError
from carl.micro.world import split_seeds
from carl.train.config import TrainConfig
from carl.train.state import branch_task_files

learning = load("learning")


def _report(path: Path, passed: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": {}, "tasks": [{"task_id": t, "n": 2, "passed": p} for t, p in passed.items()]}))


def test_task_changes_compares_the_first_and_last_eval(tmp_path):
    _report(tmp_path / "eval" / "step000000.json", {"a": 0, "b": 1, "c": 2, "d": 1})
    _report(tmp_path / "eval" / "step000003.json", {"a": 1, "b": 1, "c": 0, "d": 0})  # ignored: not the last
    _report(tmp_path / "eval" / "step000005.json", {"a": 2, "b": 1, "c": 1, "d": 0})
    assert learning.task_changes(tmp_path) == {"tasks_better": 1, "tasks_worse": 2}


def _outcomes_report(path: Path, outcomes: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": {}, "tasks": [
        {"task_id": t, "n": len(o), "infra_failures": 0, "passed": o.count("1"), "outcomes": o}
        for t, o in outcomes.items()]}))


def test_task_changes_adds_the_paired_difference_when_reports_keep_per_sample_outcomes(tmp_path):
    _outcomes_report(tmp_path / "eval" / "step000000.json", {"a": "00", "b": "10"})
    _outcomes_report(tmp_path / "eval" / "step000005.json", {"a": "11", "b": "10"})
    changes = learning.task_changes(tmp_path)
    # per task mean of B - A: a +1, b 0 -> diff 0.5; per-pair variance 0 in both tasks -> paired s.e. 0;
    # over tasks the per-task differences 1 and 0 spread: sd 0.707 / sqrt(2) = 0.5
    assert changes == {"tasks_better": 1, "tasks_worse": 0, "paired_diff": 0.5, "paired_se": 0.0,
                       "paired_se_tasks": pytest.approx(0.5)}


def _row(seed: int, warm: float, rl: float, **extra) -> dict:
    return {"seed": seed, "warm": warm, "rl": rl, "tokens": 100.0, "tool_errors": 0.1, "rl_batches": 8,
            "rl_train_pass_rate": [0.5], "finish": [None, None], **extra}


def test_over_seeds_gives_the_sample_sd_and_t_interval_and_no_pooled_test(capsys):
    rows = [_row(0, 0.2, 0.3, paired_diff=0.1, paired_se=0.03, paired_se_tasks=0.06, tasks_better=5, tasks_worse=0),
            _row(1, 0.2, 0.4, paired_diff=0.2, paired_se=0.2, paired_se_tasks=0.25, tasks_better=9, tasks_worse=1),
            _row(2, 0.2, 0.5, paired_diff=0.3, paired_se=0.05, paired_se_tasks=0.2, tasks_better=6, tasks_worse=2)]
    o = learning.over_seeds(rows)
    gain = o["rl_minus_warm"]  # 0.1, 0.2, 0.3: sd 0.1, 95% interval 0.2 ± 4.303 * 0.1 / sqrt(3) = 0.2 ± 0.248
    assert gain["mean"] == pytest.approx(0.2) and gain["sd"] == pytest.approx(0.1)
    assert (gain["ci95_low"], gain["ci95_high"]) == pytest.approx((0.2 - 0.2484, 0.2 + 0.2484), abs=1e-4)
    assert o["warm"]["sd"] == 0.0 and (o["improved"], o["beyond_2se"], o["with_se"]) == (3, 2, 3)
    assert o["beyond_2se_tasks"] == 0  # 0.1 < 0.12, 0.2 < 0.5, 0.3 < 0.4
    learning.print_summary({"grpo": rows})
    out = capsys.readouterr().out
    assert "RL - warm    +0.200 (sd 0.100, 95% CI [-0.048, +0.448], n=3)" in out
    assert "not distinguishable from 0" in out
    assert "by more than 2 paired standard errors 0/3 over tasks (2/3 by the samples' luck alone)" in out
    assert "sign test" not in out  # no test of task counts pooled over the seeds
    assert "8.0 batches;" not in out and "8.0 batches\n" in out  # runs without steps or rollouts say neither
    learning.print_summary({"grpo": [_row(0, 0.2, 0.3, rl_steps=5, rl_rollouts=96),
                                     _row(1, 0.2, 0.3, rl_steps=4, rl_rollouts=100)]})
    assert "8.0 batches, 4.5 steps, 98.0 rollouts" in capsys.readouterr().out
    learning.print_row("grpo", rows[1])
    assert "+0.200 ± 0.250 paired s.e. over tasks, ± 0.200 the samples' luck alone" in capsys.readouterr().out


def test_task_changes_needs_two_evals(tmp_path):
    assert learning.task_changes(tmp_path) == {}
    _report(tmp_path / "eval" / "step000000.json", {"a": 0})
    assert learning.task_changes(tmp_path) == {}


@pytest.mark.parametrize("better,worse,p", [(0, 0, 1.0), (5, 0, 2 / 32), (3, 3, 1.0), (6, 8, 0.79052734375),
                                            (10, 0, 2 / 1024)])
def test_sign_test_matches_the_binomial_tail(better, worse, p):
    assert learning.sign_test(better, worse) == pytest.approx(p)


def _trainer_state(ckpt: Path, phase: str = "rl", rl_step: int = 0, reports=("warm_start",)) -> None:
    ckpt.mkdir(parents=True, exist_ok=True)
    torch.save({"step": rl_step, "trainer_state": {"phase": phase, "rl_step": rl_step,
                                                   "reports": {r: {"summary": {}} for r in reports}}},
               ckpt / "trainer.pt")


def _finished_run(run_dir: Path, with_eval: bool, phase: str = "rl") -> None:
    (run_dir / "checkpoints" / "step_000000" / "model").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000000" / "model" / "weights").write_text("w0")
    _trainer_state(run_dir / "checkpoints" / "step_000000", phase,
                   reports=("warm_start", "rl") if phase == "done" else ("warm_start",))
    (run_dir / "report.json").write_text("{}")
    (run_dir / "config.toml").write_text("")  # the defaults: tasks from the run's own micro world
    (run_dir / "micro").mkdir()
    for name in ("warm_start", "rl", "eval", "rl.templates", "eval.templates"):  # the default: micro.templates
        (run_dir / "micro" / f"{name}.jsonl").write_text("")
    rows = [{"step": -1, "loss/sft": 1.0}, {"step": 0, "eval/pass@1": 0.25}, {"step": 1, "rl/reward_mean": 0.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "rl/rew')
    if with_eval:
        _report(run_dir / "eval" / "step000000.json", {"a": 1})


@pytest.mark.parametrize("with_eval", [True, False])
def test_an_arm_branches_from_the_first_arms_warm_start(tmp_path, with_eval):
    first, arm = tmp_path / "seed0_grpo", tmp_path / "seed0_grpo+errcost"
    _finished_run(first, with_eval)
    overrides = learning.branch_from(first, arm)
    assert overrides == [f"tasks={first / 'micro' / 'warm_start.jsonl'}",
                         f"rl_tasks={first / 'micro' / 'rl.templates.jsonl'}",
                         f"eval_tasks={first / 'micro' / 'eval.templates.jsonl'}"]
    assert (arm / "checkpoints" / "latest").read_text().strip() == "step_000000"
    assert (arm / "checkpoints" / "step_000000" / "model" / "weights").read_text() == "w0"
    assert (arm / "eval" / "step000000.json").exists() == with_eval  # older runs have no eval report
    steps = [json.loads(line)["step"] for line in (arm / "metrics.jsonl").read_text().splitlines()]
    assert steps == [-1, 0]  # the warm start's rows (which step 0's checkpoint counts), not the RL ones


def test_a_later_arm_that_changes_the_warm_start_is_refused(tmp_path):
    first = tmp_path / "seed0_grpo+errcost"
    _finished_run(first, with_eval=True)
    save_config(load_config(TrainConfig, None, [f"run_dir={first}"]), first / "config.toml")
    learning.refuse_warm_start_changes(first, None, ["seed=0", "rl.sd_weight=0.5"], "grpo+sd")  # RL only: fine
    with pytest.raises(SystemExit, match=r"arm grpo\+errcost\+ws64: changes the warm start "
                                         r"\(warm_start.episodes: 64 -> 128\)"):
        learning.refuse_warm_start_changes(first, None, ["warm_start.episodes=128"], "grpo+errcost+ws64")


def test_an_arm_with_other_eval_settings_evaluates_the_warm_start_again(tmp_path):
    from carl.train.state import warm_eval_changes

    first, arm = tmp_path / "seed0_grpo", tmp_path / "seed0_truncate"
    _finished_run(first, with_eval=True)
    save_config(load_config(TrainConfig, None, [f"run_dir={first}"]), first / "config.toml")
    assert learning.eval_changes(first, None, ["seed=0", "rl.sd_weight=0.5"]) == []  # training settings only
    assert learning.eval_changes(first, None, ["limits.context_strategy=truncate", "eval.samples_per_task=4"]) == [
        "eval.samples_per_task: 2 -> 4", "limits.context_strategy: 'summarize' -> 'truncate'"]
    assert learning.eval_changes(first, None, ["seed=1"]) == ["seed: 0 -> 1"]  # other episode streams
    other = tmp_path / "other.jsonl"  # `carl train --branch-from` with its own held-out tasks
    assert warm_eval_changes(first, load_config(TrainConfig, None, [f"eval_tasks={other}"])) == [
        f"eval_tasks: {str((first / 'micro' / 'eval.templates.jsonl').resolve())!r} -> {str(other)!r}"]
    learning.branch_from(first, arm, reevaluate=True)
    assert not (arm / "eval" / "step000000.json").exists()  # made again by the branch, under its settings
    assert _phase(arm / "checkpoints" / "step_000000") == ("rl", [])
    steps = [json.loads(line)["step"] for line in (arm / "metrics.jsonl").read_text().splitlines()]
    assert steps == [-1]  # the first arm's warm-start eval row is not the branch's


def _phase(ckpt: Path) -> tuple[str, list[str]]:
    state = torch.load(ckpt / "trainer.pt", weights_only=False)["trainer_state"]
    return state["phase"], sorted(state["reports"])


def test_a_branch_of_a_run_without_rl_starts_rl_at_its_warm_start(tmp_path):
    first, arm = tmp_path / "seed0_grpo", tmp_path / "seed0_grpo+errcost"
    _finished_run(first, with_eval=True, phase="done")  # rl.steps=0: step 0 was saved again as done
    learning.branch_from(first, arm)
    assert _phase(arm / "checkpoints" / "step_000000") == ("rl", ["warm_start"])
    assert _phase(first / "checkpoints" / "step_000000") == ("done", ["rl", "warm_start"])  # the first run is kept


def test_reopen_rl_leaves_a_warm_start_alone_and_refuses_a_later_step(tmp_path):
    _trainer_state(tmp_path / "a", phase="rl")
    learning.reopen_rl(tmp_path / "a")
    assert _phase(tmp_path / "a") == ("rl", ["warm_start"])
    _trainer_state(tmp_path / "b", phase="done", rl_step=5, reports=("warm_start", "rl"))
    with pytest.raises(SystemExit, match="ran 5 RL steps"):
        learning.reopen_rl(tmp_path / "b")


def test_continue_rl_needs_a_finished_run_that_ran_rl(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        learning.continue_rl(tmp_path / "missing", 8)
    run = tmp_path / "run"
    _finished_run(run, with_eval=True, phase="done")  # rl.steps=0: nothing to continue, branch instead
    (run / "checkpoints" / "latest").write_text("step_000000\n")
    with pytest.raises(SystemExit, match="after 0 RL steps"):
        learning.continue_rl(run, 8)
    assert (run / "report.json").exists() and _phase(run / "checkpoints" / "step_000000")[0] == "done"


def test_branching_needs_a_finished_first_arm(tmp_path):
    with pytest.raises(SystemExit, match="no finished run"):
        learning.branch_from(tmp_path / "missing", tmp_path / "arm")


def test_a_branched_run_passes_on_the_task_files_its_config_names(tmp_path):
    first = tmp_path / "seed0_grpo"  # itself branched from another arm: no micro/ of its own
    _finished_run(first, with_eval=True)
    (first / "config.toml").write_text('tasks = "/w/micro/warm_start.jsonl"\nrl_tasks = "/w/micro/rl.jsonl"\n'
                                       'eval_tasks = "/w/micro/eval.jsonl"\n')
    assert learning.branch_from(first, tmp_path / "arm") == [
        "tasks=/w/micro/warm_start.jsonl", "rl_tasks=/w/micro/rl.jsonl", "eval_tasks=/w/micro/eval.jsonl"]


def test_a_branch_of_a_run_on_some_templates_trains_and_evaluates_on_the_same_tasks(tmp_path):
    first = tmp_path / "seed0_grpo"
    _finished_run(first, with_eval=True)
    (first / "config.toml").write_text('[micro]\ntemplates = ["shift", "tag"]\n')
    for name in ("rl", "eval"):
        (first / "micro" / f"{name}.templates.jsonl").unlink()
    with pytest.raises(UserError, match="micro world is incomplete"):  # a run of micro.templates wrote its cut sets
        branch_task_files(first)
    for name in ("rl", "eval"):
        (first / "micro" / f"{name}.templates.jsonl").write_text("")
    micro = (first / "micro").resolve()
    assert branch_task_files(first) == {"tasks": str(micro / "warm_start.jsonl"),
                                        "rl_tasks": str(micro / "rl.templates.jsonl"),
                                        "eval_tasks": str(micro / "eval.templates.jsonl")}


@pytest.mark.filterwarnings("ignore:carl. the 'local' sandbox backend")
def test_a_branch_with_rl_repos_trains_on_its_own_rl_set_of_the_same_world(tmp_path):
    first, arm = tmp_path / "seed0_grpo", tmp_path / "seed0_grpo+more"
    _finished_run(first, with_eval=True)
    (first / "config.toml").write_text(
        "[micro]\nseed = 0\ndifficulty = 1\ntemplates = []\nmodules_per_repo = 1\ndefs_per_module = 2\nmax_tasks_per_repo = 1\n"
        '[sandbox]\nbackend = "local"\n')
    overrides = learning.branch_from(first, arm, rl_repos=2)
    assert overrides == [f"tasks={first / 'micro' / 'warm_start.jsonl'}", f"rl_tasks={arm / 'micro' / 'rl.jsonl'}",
                         f"eval_tasks={first / 'micro' / 'eval.jsonl'}"]
    tasks = [json.loads(line) for line in (arm / "micro" / "rl.jsonl").read_text().splitlines()]
    assert len(tasks) == 2 and sorted(p.name for p in (arm / "micro" / "repos" / "rl").iterdir()) == ["repo500", "repo501"]
    # its own held-out set: eval repo i of the same world (split_seeds: disjoint from the other splits)
    overrides = learning.branch_from(first, tmp_path / "seed0_grpo+eval2", eval_repos=2)
    own = tmp_path / "seed0_grpo+eval2" / "micro"
    assert overrides[1:] == [f"rl_tasks={first / 'micro' / 'rl.jsonl'}", f"eval_tasks={own / 'eval.jsonl'}"]
    assert sorted(p.name for p in (own / "repos" / "eval").iterdir()) == [f"repo{s}" for s in split_seeds("eval", 0, 2)]


def test_a_splits_repos_are_read_from_the_last_override():
    assert learning._micro_repos(["rl.steps=12"], "rl") is None
    assert learning._micro_repos(["micro.rl_repos=16", "rl.steps=3", "micro.rl_repos=8"], "rl") == 8
    assert learning._micro_repos(["micro.rl_repos=16", "micro.eval_repos=48"], "eval") == 48


def test_run_seeds_apart_runs_one_process_per_seed_with_its_own_log_and_reports_failures(tmp_path, monkeypatch):
    fake = tmp_path / "fake_learning.py"  # stands in for learning.py: records its argv, seed 1 fails
    fake.write_text("import json, sys, time\n"
                    "seed = int(sys.argv[sys.argv.index('--seeds') + 1])\n"
                    "print(json.dumps(sys.argv[1:]))\n"
                    "time.sleep(0.5)\n"
                    "sys.exit(3 if seed == 1 else 0)\n")
    monkeypatch.setattr(learning, "__file__", str(fake))
    args = learning.argparse.Namespace(seeds=[0, 1, 2], arms=["grpo"], out=str(tmp_path / "out"), config=None,
                                       overrides=["rl.steps=2"], jobs=2)
    assert learning.run_seeds_apart(args) == [1]
    for seed in (0, 1, 2):
        argv = json.loads((tmp_path / "out" / f"seed{seed}.log").read_text().splitlines()[0])
        assert argv == ["--seeds", str(seed), "--arms", "grpo", "--out", str(tmp_path / "out"), "rl.steps=2"]


def test_jobs_that_do_not_fit_in_memory_are_refused_naming_the_flag(monkeypatch, capsys):
    per_run = learning.GIB_PER_RUN
    assert learning.jobs_that_fit(2, 2 * per_run + 1) == 2
    assert learning.jobs_that_fit(2, 2 * per_run - 1) == 1 and learning.jobs_that_fit(3, 1.0) == 1
    monkeypatch.setattr(learning, "available_gib", lambda: 1.5 * per_run)
    monkeypatch.setattr(learning, "run_seeds_apart", lambda args: pytest.fail("started runs that do not fit"))
    monkeypatch.setattr("sys.argv", ["learning.py", "--seeds", "2", "3", "--jobs", "2"])
    with pytest.raises(SystemExit) as exit_:
        learning.main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--jobs: got 2" in err and "expected --jobs 1 at most here" in err, err


def test_keep_copies_what_the_summary_reads_and_no_checkpoint(tmp_path):
    out, dest = tmp_path / "out", tmp_path / "kept"
    run = out / "seed3_grpo"
    _outcomes_report(run / "eval" / "step000000.json", {"a": "00", "b": "10"})
    _outcomes_report(run / "eval" / "step000005.json", {"a": "11", "b": "10"})
    rl = {"rl/reward_mean": 0.5, "rl/pass_rate": 0.5, "rl/generated_tokens_per_episode": 100.0,
          "rl/tool_error_rate": 0.1}
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, **rl}) + "\n")
    (run / "report.json").write_text(json.dumps({"warm_start": {"pass@1": 0.25}, "rl": {"pass@1": 0.75}}))
    (run / "config.toml").write_text("seed = 3\n")
    (run / "time.json").write_text('{"processes": []}')
    (run / "checkpoints" / "step_000000").mkdir(parents=True)
    (run / "checkpoints" / "step_000000" / "trainer.pt").write_text("weights")
    (out / "learning.json").write_text("{}")
    (out / "learning.png").write_text("png")
    learning.keep(out, dest, ["seed3_grpo"])
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "learning.json", "learning.png", "seed3_grpo/config.toml", "seed3_grpo/eval/step000000.json",
        "seed3_grpo/eval/step000005.json", "seed3_grpo/metrics.jsonl", "seed3_grpo/report.json",
        "seed3_grpo/time.json"]
    assert learning.run_result(dest / "seed3_grpo", 3) == learning.run_result(run, 3)  # the summary's input, kept


@pytest.mark.parametrize("arm", sorted(learning.ARMS))
def test_every_arm_is_a_valid_config(arm):
    # a misspelt key or a bad value in an arm fails here, not after a warm start of 20 minutes
    load_config(TrainConfig, None, learning.ARMS[arm])


def test_against_first_pairs_each_later_arm_with_the_first_after_rl(tmp_path, capsys):
    for seed, first, arm in ((0, {"a": "00", "b": "10", "c": "11"}, {"a": "11", "b": "10", "c": "11"}),
                             (1, {"a": "10", "b": "00", "c": "11"}, {"a": "10", "b": "00", "c": "00"})):
        for name, outcomes in (("grpo", first), ("grpo+x", arm)):
            _outcomes_report(tmp_path / f"seed{seed}_{name}" / "eval" / "step000000.json", {"a": "00", "b": "00", "c": "00"})
            _outcomes_report(tmp_path / f"seed{seed}_{name}" / "eval" / "step000005.json", outcomes)
    results = {"grpo": [_row(0, 0, 0), _row(1, 0, 0), _row(2, 0, 0)], "grpo+x": [_row(0, 0, 0), _row(1, 0, 0)]}
    against = learning.against_first(tmp_path, results)
    a = against["grpo+x"]
    assert a["first"] == "grpo" and [r["seed"] for r in a["rows"]] == [0, 1]  # seed 2: no grpo+x run
    # seed 0: per-task arm - first = +1, 0, 0 -> +1/3, s.e. over tasks sd(1, 0, 0) / sqrt(3) = 0.333;
    # seed 1: 0, 0, -1 -> -1/3, the same s.e.
    assert [r["diff"] for r in a["rows"]] == pytest.approx([1 / 3, -1 / 3])
    assert [r["se_tasks"] for r in a["rows"]] == pytest.approx([1 / 3, 1 / 3])
    assert a["over_seeds"]["mean"] == pytest.approx(0) and a["over_seeds"]["sd"] == pytest.approx(0.4714, abs=1e-4)
    assert (a["above_2se"], a["below_2se"]) == (0, 0)
    learning.print_against(against)
    assert "grpo+x - grpo" in capsys.readouterr().out
    assert learning.against_first(tmp_path, {"grpo": results["grpo"]}) == {}
