"""benchmarks/fit.py's pure parts: which tasks it fits, and the held-out eval it drops from a branch."""

import json
from pathlib import Path

import pytest

from benchmark_modules import load
from carl.tasks import TaskRecord

fit = load("fit")


def test_pick_tasks_takes_one_per_repo_in_turn():
    tasks = [TaskRecord(instance_id=f"{repo}__{i}", repo=repo) for repo in ("r2", "r1", "r3") for i in (1, 0)]
    tasks += [TaskRecord(instance_id="r1__2", repo="r1")]
    ids = [t.instance_id for t in fit.pick_tasks(tasks, 5)]
    assert ids == ["r1__0", "r2__0", "r3__0", "r1__1", "r2__1"]
    assert len(fit.pick_tasks(tasks, 100)) == len(tasks)  # asking for more than there are gives all
    assert fit.pick_tasks(tasks, 1)[0].instance_id == "r1__0"


def test_drop_held_out_eval_keeps_the_warm_start_rows_but_not_their_eval(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "step000000.json").write_text("{}")
    rows = [{"step": -1, "loss/sft": 0.1}, {"step": 0, "eval/pass@1": 0.3, "eval/pass@k": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fit.drop_held_out_eval(tmp_path)
    assert not (tmp_path / "eval" / "step000000.json").exists()
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == [{"loss/sft": 0.1, "step": -1}, {"step": 0}]


def test_print_summary_compares_each_task_before_and_after(tmp_path, capsys):
    def report(path: Path, passed: dict[str, int], pass_at_1: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tasks = [{"task_id": t, "n": 8, "passed": p} for t, p in passed.items()]
        path.write_text(json.dumps({"summary": {"pass@1": pass_at_1}, "tasks": tasks}))

    report(tmp_path / "fit_warm.json", {"a": 4, "b": 3}, 7 / 16)
    report(tmp_path / "eval" / "step000008.json", {"a": 8, "b": 6}, 14 / 16)
    rows = [{"step": 0}, {"step": 1, "rl/pass_rate": 0.5}, {"step": 2, "rl/pass_rate": 0.75}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fit.print_summary(tmp_path, tmp_path / "fit_warm.json")
    out = capsys.readouterr().out
    assert "pass@1 0.438 (warm start) -> 0.875 (after RL)" in out
    assert "a: 4/8 -> 8/8" in out and "b: 3/8 -> 6/8" in out
    assert "per step: 0.50 0.75" in out


transfer = load("transfer")


def test_transfer_picks_tasks_by_template_and_a_control_that_spans_the_others():
    def task(i: str, name: str) -> TaskRecord:
        return TaskRecord(instance_id=i, repo=i[:2], deleted_symbols=(f"pkg.numbers:{name}",))

    assert transfer.template(task("r1__0", "square_plus_price")) == "square_plus"
    rl = [task("r1__0", "add_price"), task("r1__1", "sub_score"), task("r2__0", "add_level")]
    held = [task("h1__0", "add_name"), task("h1__1", "mod_name"), task("h2__0", "mod_label"),
            task("h2__1", "upper_token"), task("h3__0", "upper_value")]
    rl_set, same, control = transfer.pick(rl, held, ["add"], control=3)
    assert [t.instance_id for t in rl_set] == ["r1__0", "r2__0"]
    assert [t.instance_id for t in same] == ["h1__0"]
    assert [t.instance_id for t in control] == ["h1__1", "h2__1", "h2__0"]  # mod, upper, then mod again
    assert transfer.pick(rl, held, ["add"], control=0)[2] == []


def test_transfer_summary_pairs_the_two_evals_per_group_and_template(tmp_path, capsys):
    from carl.tasks import write_tasks

    names = {"h1": "add_price", "h2": "add_name", "h3": "mod_label"}
    write_tasks(tmp_path / "transfer_eval.jsonl",
                [TaskRecord(instance_id=i, repo=i, deleted_symbols=(f"p.m:{n}",)) for i, n in names.items()])

    def report(path: Path, outcomes: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tasks = [{"task_id": t, "n": len(o), "infra_failures": 0, "outcomes": o, "digests": list(o)}
                 for t, o in outcomes.items()]
        path.write_text(json.dumps({"tasks": tasks}))

    report(tmp_path / "transfer_warm.json", {"h1": "0011", "h2": "0000", "h3": "1100"})
    report(tmp_path / "eval" / "step000008.json", {"h1": "1111", "h2": "0001", "h3": "1100"})
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "rl/pass_rate": 0.25}) + "\n")
    transfer.print_summary(tmp_path, tmp_path / "transfer_warm.json", ["add"])
    out = capsys.readouterr().out
    assert "same templates" in out and "0.250 -> 0.625  +0.375" in out  # h1 0.5 -> 1.0, h2 0 -> 0.25
    assert "other templates (control)" in out and "0.500 -> 0.500  +0.000" in out
    saved = json.loads((tmp_path / "transfer.json").read_text())
    assert saved["groups"]["same templates"]["tasks_better"] == 2 and saved["rl_pass_rate"] == [0.25]


transfer_seeds = load("transfer_seeds")


def test_transfer_seeds_combines_runs_into_mean_sample_sd_and_interval_with_per_seed_sign_tests(tmp_path, capsys):
    def run(seed: int, same: float, control: float, better: int, worse: int, add: float) -> Path:
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        group = {"pass_a": 0.2, "se_paired": 0.03, "tasks_worse": 0}
        (d / "transfer.json").write_text(json.dumps({"templates": ["add"], "groups": {
            "same templates": group | {"diff": same, "pass_b": 0.2 + same, "tasks_better": better,
                                       "tasks_worse": worse, "se_paired": 0.04},
            "other templates (control)": group | {"diff": control, "pass_b": 0.2 + control, "tasks_better": 1},
            "  add": group | {"diff": add}}}))
        (d / "transfer_config.toml").write_text(f"seed = {seed}\n")
        return d

    runs = [transfer_seeds.load_run(run(2, 0.2, 0.0, 6, 0, 0.2)), transfer_seeds.load_run(run(3, 0.1, 0.05, 4, 0, 0.1))]
    result = transfer_seeds.combine(runs)
    over = result["over_seeds"]
    # gains 0.2 and 0.1: sample sd sqrt(2 * 0.05^2 / 1) = 0.0707; 95% interval 0.15 ± 12.706 * 0.0707 / sqrt(2)
    assert over["same"]["mean"] == pytest.approx(0.15) and over["same"]["sd"] == pytest.approx(0.0707, abs=1e-4)
    assert (over["same"]["ci95_low"], over["same"]["ci95_high"]) == pytest.approx((0.15 - 0.6353, 0.15 + 0.6353),
                                                                                  abs=1e-4)
    assert over["same_minus_control"]["mean"] == pytest.approx(0.125) and over["control"]["positive"] == 1
    assert result["runs"][0]["same_minus_control_se"] == pytest.approx(0.05)  # sqrt(0.04^2 + 0.03^2)
    assert "pooled" not in result  # task counts are not pooled over seeds into one test
    assert [r["sign_test_p"] for r in result["runs"]] == pytest.approx([2 / 2**6, 2 / 2**4])  # 6/0 and 4/0
    assert result["per_template"]["add"]["mean"] == pytest.approx(0.15)
    transfer_seeds.print_result(result)
    out = capsys.readouterr().out
    assert "+0.150 (sd 0.071, 95% CI [-0.485, +0.785], n=2)" in out
    assert "not distinguishable from 0" in out
    with pytest.raises(SystemExit, match="transfer.json: not found"):
        transfer_seeds.load_run(tmp_path / "nothing")


def test_transfer_seeds_reads_a_kept_transfer_json_with_its_seed(tmp_path, capsys):
    group = {"pass_a": 0.25, "pass_b": 0.5, "diff": 0.25, "se_paired": 0.05, "tasks_better": 3, "tasks_worse": 1}
    kept = tmp_path / "seed7.json"  # no transfer_config.toml beside it, no per-template groups
    kept.write_text(json.dumps({"seed": 7, "templates": ["add"], "groups": {
        "same templates": group, "other templates (control)": group | {"diff": 0.0}}}))
    run = transfer_seeds.load_run(kept)
    assert run["seed"] == 7
    result = transfer_seeds.combine([run])
    assert result["per_template"] == {} and result["over_seeds"]["rl_same"]["mean"] == pytest.approx(0.5)
    transfer_seeds.print_result(result)
    out = capsys.readouterr().out
    assert "warm start pass@1  0.250 (n=1, no spread)" in out and "after-RL pass@1    0.500 (n=1, no spread)" in out


async_learning = load("async_learning")


def test_async_learning_pairs_the_arms_sample_by_sample_on_the_trained_templates_only(tmp_path, capsys):
    from carl.tasks import write_tasks

    names = {"h1": "add_price", "h2": "add_name", "h3": "mod_label"}  # h3: a control task, left out of the pairing

    def arm(name: str, after: dict[str, str], gain: float, stale: list[float]) -> None:
        d = tmp_path / "seed5" / name
        (d / "eval").mkdir(parents=True)
        write_tasks(d / "transfer_eval.jsonl",
                    [TaskRecord(instance_id=i, repo=i, deleted_symbols=(f"p.m:{n}",)) for i, n in names.items()])
        same = {"diff": gain, "se_paired": 0.1, "pass_a": 0.25, "pass_b": 0.25 + gain}
        (d / "transfer.json").write_text(json.dumps({"templates": ["add"], "rl_pass_rate": [0.5],
                                                     "groups": {"same templates": same}}))
        tasks = [{"task_id": t, "n": len(o), "infra_failures": 0, "outcomes": o, "digests": list(o)}
                 for t, o in after.items()]
        (d / "eval" / "step000004.json").write_text(json.dumps({"tasks": tasks}))
        rows = [{"step": s + 1, "rl/rollouts_total": 8.0 * (s + 1), "staleness/token_mean": x,
                 "staleness/token_max": 2.0 * bool(x)} for s, x in enumerate(stale)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    arm("sync", {"h1": "1100", "h2": "0000", "h3": "1111"}, 0.0, [0.0, 0.0])
    arm("async", {"h1": "1110", "h2": "0001", "h3": "0000"}, 0.25, [0.0, 1.5])
    r = async_learning.seed_result(5, tmp_path / "seed5", {"sync": 0, "async": 2})
    d = r["async_minus_sync"]
    assert (d["tasks"], d["pairs"]) == (2, 8)  # h3 is not a trained template
    assert d["sync"] == 0.25 and d["async"] == 0.5 and d["diff"] == 0.25
    assert r["async"]["rollouts"] == 16 and r["async"]["staleness_token_mean"] == [0.0, 1.5]
    async_learning.print_summary([r, r | {"seed": 6}], 2)
    out = capsys.readouterr().out
    assert "rollouts 16 and 16" in out and "0.00 1.50 (max 2)" in out
    assert "async - sync" in out and "+0.250 (sd 0.000" in out
    summary = async_learning.summarize([r, r | {"seed": 6}])
    assert summary["async gain"]["values"] == [0.25, 0.25] and summary["sync gain"]["mean"] == 0.0
    async_learning.plot([r], 2, tmp_path / "a.png")
    assert (tmp_path / "a.png").stat().st_size > 0
