"""The learning benchmark's statistics: per-task better/worse counts from eval reports, the sign test."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("learning", Path(__file__).parents[1] / "benchmarks" / "learning.py")
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def _report(path: Path, passed: dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"summary": {}, "tasks": [{"task_id": t, "n": 2, "passed": p} for t, p in passed.items()]}))


def test_task_changes_compares_the_first_and_last_eval(tmp_path):
    _report(tmp_path / "eval" / "step000000.json", {"a": 0, "b": 1, "c": 2, "d": 1})
    _report(tmp_path / "eval" / "step000003.json", {"a": 1, "b": 1, "c": 0, "d": 0})  # ignored: not the last
    _report(tmp_path / "eval" / "step000005.json", {"a": 2, "b": 1, "c": 1, "d": 0})
    assert learning.task_changes(tmp_path) == {"tasks_better": 1, "tasks_worse": 2}


def test_task_changes_needs_two_evals(tmp_path):
    assert learning.task_changes(tmp_path) == {}
    _report(tmp_path / "eval" / "step000000.json", {"a": 0})
    assert learning.task_changes(tmp_path) == {}


@pytest.mark.parametrize("better,worse,p", [(0, 0, 1.0), (5, 0, 2 / 32), (3, 3, 1.0), (6, 8, 0.79052734375),
                                            (10, 0, 2 / 1024)])
def test_sign_test_matches_the_binomial_tail(better, worse, p):
    assert learning.sign_test(better, worse) == pytest.approx(p)
