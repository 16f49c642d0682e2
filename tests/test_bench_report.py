"""`carl bench report` (tables, a self-contained HTML page with plots) and `carl bench compare`
(paired differences for runs, grades, and one of each), on results built by the real report
builders from hand-made samples and grades: no sandbox, no model."""

import base64
import json
import math
import re

import pytest

from carl.cli import main
from carl.eval.bench_compare import compare_results
from carl.eval.bench_run import Price, build_run_report
from carl.eval.grade import GradedTask
from carl.eval.grade_report import build_grade_report
from carl.eval.report import Sample
from carl.tasks import TaskRecord

TASKS = [TaskRecord(f"pkg__1-{kind}-stub-{i}", "pkg" if i < 3 else "other", deletion_kind=kind, size_lines=lines,
                    size_files=1 + i % 2, FAIL_TO_PASS=("t::a",) * (1 + i))
         for i, (kind, lines) in enumerate([("function", 3), ("method", 12), ("class", 40), ("function", 4)])]


def _run(outcomes: list[str], name: str, digest: str = "d") -> dict:
    """A run result: task i's samples pass where outcomes[i] has a "1" ("x": infrastructure failure)."""
    samples = [Sample(t.instance_id, o == "1", float(o == "1"), 100 + j, 3, 0, 2.0, infra_failure=o == "x",
                      sample=j, input_tokens=1000, digest=f"{digest}{i}{j}",
                      monitor_flags=["test_edit"] if o == "f" else [])
               for i, (t, os_) in enumerate(zip(TASKS, outcomes)) for j, o in enumerate(os_)]
    return build_run_report(name, TASKS, samples, k=len(outcomes[0]), price=Price(1.0, 4.0),
                            extra={"suite": "s", "suite_lock_sha256": "abc"})


def _grade(resolved: list[bool], name: str) -> dict:
    graded = [GradedTask(t.instance_id, "resolved" if r else "failed", resolved=r, reward=float(r),
                         patch_sha256=f"p{i}{r}") for i, (t, r) in enumerate(zip(TASKS, resolved))]
    return build_grade_report(name, TASKS, graded, extra={"suite": "s", "suite_lock_sha256": "abc"})


def test_a_run_results_numbers(tmp_path):
    r = _run(["11", "10", "00", "1x"], "a")
    s = r["summary"]
    assert s["pass@1"] == pytest.approx((1 + 0.5 + 0 + 1) / 4) and s["pass@k"] == pytest.approx(3 / 4)
    assert s["samples"] == 7 and s["infra_failures"] == 1 and s["n"] == 4
    assert s["cost_per_task_usd"] == pytest.approx((1000 * 1 + 100.5 * 4) / 1e6, rel=0.01)
    assert r["strata"]["repo"]["pkg"]["n"] == 3 and r["strata"]["repo"]["other"]["pass@1"] == 1.0
    assert list(r["strata"]["size_lines"]) == ["1-5", "6-20", "21+"]
    lo, hi = s["ci95"]
    assert lo < s["pass@1"] < hi


def _self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "<link" not in page
    assert not re.search(r"(src|href)=['\"](?!data:)", page), "a resource from outside the page"
    assert "http://" not in page and "https://" not in page and "url(" not in page
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) >= 3
    for data in images:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_reports_are_self_contained_for_runs_and_grades(tmp_path, capsys):
    for result, name in ((_run(["11", "10", "00", "1f"], "run-a"), "run"),
                         (_grade([True, False, True, False], "g"), "grade"),
                         (_grade([True] * 4, "gold"), "gold")):  # every rate 1: intervals end at p
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(result))
        html = tmp_path / f"{name}.html"
        assert main(["bench", "report", str(path), "--html", str(html)]) == 0
        page = html.read_text()
        _self_contained(page)
        assert "pass@1 by stratum" in page and "pass@1 by package" in page and TASKS[2].instance_id in page
        assert "self-contained" in capsys.readouterr().out
    assert "test_edit" in (tmp_path / "run.html").read_text()  # the monitor's flags are shown


def test_compare_two_runs_is_carl_compares_paired_difference(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run(["11", "10", "00", "10"], "a")))
    b.write_text(json.dumps(_run(["11", "11", "10", "10"], "b")))
    out = tmp_path / "c.json"
    assert main(["bench", "compare", str(a), str(b), "--out", str(out)]) == 0
    c = json.loads(out.read_text())
    assert c["method"] == "samples" and c["tasks"] == 4 and c["pairs"] == 8
    assert c["diff"] == pytest.approx((0 + 0.5 + 0.5 + 0) / 4)
    # per task: mean of b - a over its samples, each task's variance / its n, averaged as pass@1 is
    var = [0, 0.5 / 2, 0.5 / 2, 0]
    assert c["se_paired"] == pytest.approx(math.sqrt(sum(var)) / 4)
    assert {row["task"]: (row["a"], row["b"]) for row in c["changed"]} == {
        TASKS[1].instance_id: ("1/2", "2/2"), TASKS[2].instance_id: ("0/2", "1/2")}
    assert "+0.250 ±" in capsys.readouterr().out
    assert main(["bench", "compare", str(b), str(a), "--fail-if-worse"]) == 0  # -0.25 ± 0.177: within 1.64 SE


def test_compare_two_grades_pairs_by_instance_id(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_grade([True, False, True, False], "a")))
    b.write_text(json.dumps(_grade([True, True, True, True], "b")))
    out = tmp_path / "c.json"
    assert main(["bench", "compare", str(a), str(b), "--out", str(out)]) == 0
    c = json.loads(out.read_text())
    # d = [0, 1, 0, 1]: mean 0.5, sample sd 0.577, SE = 0.577 / 2
    assert c["method"] == "tasks" and c["diff"] == 0.5 and c["se_paired"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert c["tasks_better"] == 2 and c["identical"] == 2 and c["same_suite"] is True
    assert main(["bench", "compare", str(b), str(a), "--fail-if-worse"]) == 3  # -0.5, z = -1.73
    assert "worse than A" in capsys.readouterr().err


def test_compare_a_run_with_graded_predictions(tmp_path):
    c = compare_results(_run(["11", "10", "00", "1x"], "carl"), _grade([True, True, False, False], "other"))
    assert c["method"] == "tasks" and c["tasks"] == 4
    assert c["pass_a"] == pytest.approx((1 + 0.5 + 0 + 1) / 4) and c["pass_b"] == 0.5
    assert {row["task"]: row["b"] for row in c["changed"]} == {TASKS[1].instance_id: "resolved",
                                                              TASKS[3].instance_id: "failed"}


def test_report_and_compare_give_one_line_errors_on_bad_input(tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "odd.json").write_text(json.dumps({"summary": {}, "tasks": [{"x": 1}]}))
    for argv, expected in (
        (["report", str(tmp_path / "none.json")], "RESULTS: "),
        (["report", str(tmp_path / "list.json")], "has no 'summary' and 'tasks'"),
        (["report", str(tmp_path / "odd.json")], "neither 'outcomes' (a run) nor 'status' (a grade)"),
        (["compare", str(tmp_path / "list.json"), str(tmp_path / "none.json")], "A: "),
    ):
        assert main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_grade([True] * 4, "a")))
    other = _grade([True] * 4, "b")
    for t in other["tasks"]:
        t["instance_id"] += "-elsewhere"
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert main(["bench", "compare", str(a), str(tmp_path / "b.json")]) == 2
    assert "share no task" in capsys.readouterr().err
