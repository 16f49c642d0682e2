"""benchmarks/fit.py's pure parts: which tasks it fits, and the held-out eval it drops from a branch."""

import importlib.util
import json
import sys
from pathlib import Path

from carl.tasks import TaskRecord

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))  # fit.py imports learning.py beside it
_spec = importlib.util.spec_from_file_location("fit", Path(__file__).parents[1] / "benchmarks" / "fit.py")
fit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit)


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
