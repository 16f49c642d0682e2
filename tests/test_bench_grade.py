"""`carl bench grade` and `carl bench export` on a real micro world (generated repo -> feature
deletion -> validation, local sandbox): a hand-made predictions file scores exactly as
constructed, a test edit is caught as in RL, a killed run resumes without grading anything
twice, and exported records keep SWE-bench's and SWE-smith's conventions."""

import json
import re
import shutil
from pathlib import Path

import pytest

from carl.cli import main
from carl.eval.export import SWE_BENCH_FIELDS, SWE_SMITH_FIELDS, reverse_patch
from carl.eval.grade import Prediction, load_partial
from carl.eval.grade_report import wilson_interval
from carl.sandbox.bwrap import bwrap_available
from carl.tasks import TaskRecord, load_tasks, original_repo_dir
from carl.tasks.patch import apply_patch, file_diff

pytestmark = pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Six one-function tasks of one micro repo (~5 s, shared by this module's tests)."""
    from carl.micro.world import build_micro_tasks

    out = tmp_path_factory.mktemp("micro")
    tasks = build_micro_tasks(out, seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=6, backend="local")["eval"]
    assert len(tasks) == 6
    return out / "eval.jsonl", tasks


def _test_edit(task: TaskRecord, body: str = "    pass\n") -> str:
    """A diff that replaces the body of the task's FAIL_TO_PASS test by `body` (it then passes on the broken code)."""
    path, name = task.FAIL_TO_PASS[0].split("::")
    old = open(f"{task.broken_repo}/{path}").read()
    new = re.sub(rf"(def {name}\(\):\n)((    .*\n)+)", lambda m: m.group(1) + body, old)
    assert new != old
    return file_diff(path, old, new)


# what each task's prediction is, and the outcome it must get
CONSTRUCTED = ("gold", "gold", "empty", "test_edit", "bad_patch", "missing")
EXPECTED = {"gold": "resolved", "empty": "empty", "test_edit": "failed", "bad_patch": "patch_error",
            "missing": "missing"}


def _predictions(tasks, path):
    rows = []
    for kind, t in zip(CONSTRUCTED, tasks):
        patch = {"gold": t.patch, "empty": "", "test_edit": _test_edit(t) if kind == "test_edit" else "",
                 "bad_patch": t.patch.replace("raise NotImplementedError", "raise ValueError")}.get(kind)
        if patch is not None:
            rows.append({"instance_id": t.instance_id, "model_patch": patch, "model_name_or_path": "by-hand"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def graded(world, tmp_path_factory):
    tasks_path, tasks = world
    d = tmp_path_factory.mktemp("graded")
    preds = _predictions(tasks, d / "preds.jsonl")
    out = d / "report.json"
    assert main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out),
                 "--sandbox", "local", "--workers", "2"]) == 0
    return preds, out, json.loads(out.read_text())


def test_grading_comes_out_exactly_as_constructed(world, graded):
    _, tasks = world
    _, _, report = graded
    rows = {r["instance_id"]: r for r in report["tasks"]}
    for kind, t in zip(CONSTRUCTED, tasks):
        r = rows[t.instance_id]
        assert r["status"] == EXPECTED[kind], (kind, r)
        assert r["resolved"] is (kind == "gold") and r["reward"] == (1.0 if kind == "gold" else 0.0), (kind, r)
        assert (r["monitor_flags"] == ["test_edit"]) is (kind == "test_edit"), (kind, r)
        assert not r["infra_failure"]
    test_edit = rows[tasks[3].instance_id]
    assert test_edit["ignored"] == [tasks[3].FAIL_TO_PASS[0].split("::")[0]]  # the original test ran
    assert tasks[3].FAIL_TO_PASS[0] in test_edit["failed_tests"]
    assert "hunk does not match" in rows[tasks[4].instance_id]["reason"]
    s = report["summary"]
    assert (s["name"], s["num_tasks"], s["n"], s["resolved"]) == ("by-hand", 6, 6, 2)
    assert s["pass@1"] == pytest.approx(2 / 6) and s["ci95"] == pytest.approx(list(wilson_interval(2, 6)))
    assert s["statuses"] == {"resolved": 2, "failed": 1, "empty": 1, "missing": 1, "patch_error": 1,
                             "infra_failure": 0}
    assert s["monitor_flags"] == {"test_edit": 1} and s["monitor_action"] == "zero"
    assert report["strata"]["deletion_kind"] == {"function": {"n": 6, "resolved": 2, "pass@1": pytest.approx(2 / 6),
                                                              "ci95": s["ci95"], "infra_failures": 0}}
    assert set(report["strata"]) == {"deletion_kind", "size_lines", "size_files", "fail_to_pass", "repo"}
    assert list(report["strata"]["size_lines"]) == ["1-5"] and list(report["strata"]["fail_to_pass"]) == ["1"]


def test_tests_that_pass_with_a_test_edit_are_not_resolved(world, tmp_path):
    """The gold fix plus a gutted test: the tests pass (the original ones, restored), but the monitor
    flags the edit, so the RL reward is 0 (action "zero") and it does not count as resolved."""
    tasks_path, tasks = world
    t = tasks[0]
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": t.instance_id, "model_patch": t.patch + _test_edit(t)}) + "\n")
    backend = "bwrap" if bwrap_available() else "local"
    out = tmp_path / "report.json"
    assert main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out),
                 "--sandbox", backend]) == 0
    r = next(r for r in json.loads(out.read_text())["tasks"] if r["instance_id"] == t.instance_id)
    assert (r["status"], r["resolved"], r["test_reward"], r["reward"]) == ("failed", False, 1.0, 0.0), r
    assert r["monitor_flags"] == ["test_edit"] and "monitor flagged" in r["reason"]


def test_a_killed_run_resumes_and_grades_each_task_once(world, graded, tmp_path, capsys):
    tasks_path, tasks = world
    preds, first_out, first = graded
    lines = (first_out.parent / "report.json.partial.jsonl").read_text().splitlines()
    assert len(lines) == 6
    out = tmp_path / "report.json"
    partial = tmp_path / "report.json.partial.jsonl"
    partial.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed while writing the 2nd line
    with pytest.warns(UserWarning, match="torn"):
        code = main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out),
                     "--sandbox", "local"])
    assert code == 0
    assert "1 of 6 tasks already graded" in capsys.readouterr().out
    ids = [json.loads(line)["instance_id"] for line in partial.read_text().splitlines()]
    assert sorted(ids) == sorted(t.instance_id for t in tasks)  # each graded exactly once
    second = json.loads(out.read_text())
    assert second["summary"]["graded_now"] == 5

    def outcome(report):
        return [{k: v for k, v in r.items() if k != "duration_s"} for r in report["tasks"]]

    assert outcome(second) == outcome(first) and second["strata"] == first["strata"]
    # a rerun over the complete partial file grades nothing; a changed prediction is graded again
    assert main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out),
                 "--sandbox", "local"]) == 0
    assert len(partial.read_text().splitlines()) == 6 and json.loads(out.read_text())["summary"]["graded_now"] == 0
    first_id = json.loads(lines[0])["instance_id"]
    changed = {first_id: Prediction(first_id, "--- a/x\n+++ b/x\n")}
    assert first_id not in load_partial(partial, changed)


def test_predictions_for_unknown_tasks_are_an_error(world, tmp_path, capsys):
    tasks_path, tasks = world
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": tasks[0].instance_id, "model_patch": ""}) + "\n"
                     + json.dumps({"instance_id": "nope__1-function-stub-0", "model_patch": ""}) + "\n")
    out = tmp_path / "report.json"
    assert main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out)]) == 2
    assert "'nope__1-function-stub-0'" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("line,expected", [
    ({"instance_id": "x"}, "line 1: model_patch: missing"),
    ({"instance_id": 3, "model_patch": ""}, "line 1: instance_id: got 3"),
    ({"instance_id": "x", "model_patch": ["a"]}, "model_patch: got a list"),
    ([1], "expected an object"),
])
def test_bad_predictions_name_the_line_and_field(world, tmp_path, capsys, line, expected):
    tasks_path, _ = world
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps(line) + "\n")
    out = tmp_path / "report.json"
    assert main(["bench", "grade", "--tasks", str(tasks_path), "--predictions", str(preds), "--out", str(out)]) == 2
    assert expected in capsys.readouterr().err


def test_swe_agent_preds_json_keyed_by_instance_id_loads(tmp_path):
    from carl.eval.grade import load_predictions

    path = tmp_path / "preds.json"
    path.write_text(json.dumps({"a": {"model_patch": "p", "model_name_or_path": "m"}, "b": {"model_patch": None}}))
    assert load_predictions(path) == {"a": Prediction("a", "p", "m"), "b": Prediction("b", "")}


def test_export_swe_bench_round_trips_and_encodes_lists(world, tmp_path):
    tasks_path, tasks = world
    out = tmp_path / "swe.jsonl"
    assert main(["bench", "export", "--tasks", str(tasks_path), "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by_id = {t.instance_id: t for t in tasks}
    assert sorted(r["instance_id"] for r in records) == sorted(by_id)
    for rec in records:
        t = by_id[rec["instance_id"]]
        assert set(rec) == set(SWE_BENCH_FIELDS)
        assert isinstance(rec["FAIL_TO_PASS"], str) and json.loads(rec["FAIL_TO_PASS"]) == list(t.FAIL_TO_PASS)
        assert json.loads(rec["PASS_TO_PASS"]) == list(t.PASS_TO_PASS)
        back = TaskRecord.from_dict(rec)  # carl reads SWE-bench records
        for name in ("instance_id", "repo", "base_commit", "patch", "problem_statement", "FAIL_TO_PASS",
                     "PASS_TO_PASS", "created_at"):
            assert getattr(back, name) == getattr(t, name), name


def test_export_swe_smith_patch_is_the_bug(world, tmp_path):
    tasks_path, _ = world
    out = tmp_path / "smith.jsonl"
    assert main(["bench", "export", "--tasks", str(tasks_path), "--out", str(out), "--format", "swe-smith"]) == 0
    rec = json.loads(out.read_text().splitlines()[0])
    assert set(rec) == set(SWE_SMITH_FIELDS) and isinstance(rec["FAIL_TO_PASS"], list)
    t = next(t for t in load_tasks(tasks_path) if t.instance_id == rec["instance_id"])
    tree = tmp_path / "tree"
    shutil.copytree(t.broken_repo, tree)
    changed = apply_patch(tree, t.patch)  # broken + gold = the original
    assert changed and all((tree / p).read_text() == (original_repo_dir(t) / p).read_text() for p in changed)
    apply_patch(tree, rec["patch"])  # original + SWE-smith's bug patch = the broken repo
    assert all((tree / p).read_text() == (Path(t.broken_repo) / p).read_text() for p in changed)


def test_reverse_patch_undoes_created_deleted_and_unterminated_files(tmp_path):
    diff = (file_diff("new.py", None, "a\nb") + file_diff("gone.py", "x\n", None)
            + file_diff("m.py", "-- not a header\nkeep\n", "--- still not\nkeep\nmore"))
    (tmp_path / "gone.py").write_text("x\n")
    (tmp_path / "m.py").write_text("-- not a header\nkeep\n")
    apply_patch(tmp_path, diff)
    assert not (tmp_path / "gone.py").exists() and (tmp_path / "new.py").read_text() == "a\nb"
    assert reverse_patch(reverse_patch(diff)) == diff
    apply_patch(tmp_path, reverse_patch(diff))
    assert not (tmp_path / "new.py").exists() and (tmp_path / "gone.py").read_text() == "x\n"
    assert (tmp_path / "m.py").read_text() == "-- not a header\nkeep\n"


def test_wilson_interval():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(2, 6)
    assert (round(lo, 4), round(hi, 4)) == (0.0968, 0.7)  # Brown, Cai & DasGupta 2001's formula by hand
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and 0.72 < lo < 0.73
