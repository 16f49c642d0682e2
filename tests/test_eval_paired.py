"""carl.eval.paired: the difference of two eval reports sample by sample, against hand-computed values."""

import math

import pytest

from carl.eval.paired import paired_difference


def report(*tasks):
    """tasks: (task_id, outcomes, digests)"""
    return {"tasks": [{"task_id": i, "n": sum(c != "x" for c in o), "infra_failures": o.count("x"), "outcomes": o,
                       "digests": d} for i, o, d in tasks]}


def test_paired_difference_matches_hand_values():
    a = report(("t1", "1100", ["a", "b", "c", "d"]), ("t2", "0000", ["e", "f", "g", "h"]))
    b = report(("t1", "1110", ["a", "b", "x", "y"]), ("t2", "0001", ["e", "f", "g", "z"]))
    d = paired_difference(a, b)
    assert (d.tasks, d.pairs, d.identical, d.agree, d.tasks_better, d.tasks_worse) == (2, 8, 5, 6, 2, 0)
    assert d.per_task == (("t1", 2, 3, 4), ("t2", 0, 1, 4))
    assert (d.pass_a, d.pass_b, d.diff) == (pytest.approx(0.25), pytest.approx(0.5), pytest.approx(0.25))
    # t1: d = 0,0,1,0 -> var 0.25, /4; t2 the same; se = sqrt(2 * 0.0625) / 2
    assert d.se_paired == pytest.approx(math.sqrt(0.125) / 2)
    # t1: var(A) = 1/3, var(B) = 0.25; t2: var(A) = 0, var(B) = 0.25 -> (1/3 + 0.5) / 4 in all
    assert d.se_independent == pytest.approx(math.sqrt((1 / 3 + 0.5) / 4) / 2)
    assert d.variance_ratio == pytest.approx((1 / 3 + 0.5) / 4 / 0.125)


def test_identical_samples_have_no_paired_noise_and_infra_failures_drop_the_pair():
    a = report(("t", "10x1", ["p", "q", "r", "s"]))
    b = report(("t", "1001", ["p", "q", "r", "s"]))  # sample 2 failed in A's infrastructure: not a pair
    d = paired_difference(a, b)
    assert (d.pairs, d.identical, d.diff, d.se_paired) == (3, 3, 0.0, 0.0)
    assert d.se_independent > 0 and d.variance_ratio == math.inf


def test_tasks_in_one_report_only_are_skipped_and_reports_without_outcomes_are_refused():
    a = report(("t1", "1", ["a"]), ("t2", "0", ["b"]))
    b = report(("t2", "1", ["c"]), ("t3", "1", ["d"]))
    assert paired_difference(a, b).tasks == 1
    with pytest.raises(ValueError, match="share no task"):
        paired_difference(report(("t1", "1", ["a"])), report(("t9", "1", ["a"])))
    old = {"tasks": [{"task_id": "t1", "n": 2, "infra_failures": 0, "passed": 1}]}  # before per-sample outcomes
    with pytest.raises(ValueError, match="report a, task t1: no per-sample outcomes"):
        paired_difference(old, a)


def test_compare_cli_prints_the_difference_and_names_a_bad_report(tmp_path, capsys):
    import json

    from carl.cli import main

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path, o, d in ((a, "1100", ["p", "q", "r", "s"]), (b, "1110", ["p", "q", "z", "s"])):
        path.write_text(json.dumps(report(("t1", o, d))))
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "0.500 -> 0.750: +0.250 ± 0.250" in out and "1 tasks better, 0 worse; 3 episodes identical" in out
    assert "2/4" in out and "3/4" in out  # the changed task's row
    assert "over tasks" in out and "+0.250 ± 0.000; B differs from A by +0.250 with no spread" in out  # one task
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["compare", str(a), str(tmp_path / "bad.json")]) != 0
    assert "b: " in capsys.readouterr().err
    assert main(["compare", str(a), str(tmp_path / "missing.json")]) != 0
    assert "is not a readable eval report" in capsys.readouterr().err
