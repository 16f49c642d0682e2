import math

import pytest

from carl.eval.report import Sample, build_report, pass_at_k, render_table


def test_pass_at_k_matches_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k(2, 1, 3)


def test_infra_failures_are_excluded_not_zero():
    s = [
        Sample("a", True, 1.0, 10, 3, 0, 1.0),
        Sample("a", False, 0.0, 20, 5, 1, 2.0, infra_failure=True),
        Sample("b", False, 0.0, 30, 4, 0, 3.0),
        Sample("b", True, 1.0, 10, 2, 0, 1.0),
    ]
    r = build_report("t", s, k=2)
    a, b = r.tasks
    assert (a.n, a.passed, a.pass_at_1, a.infra_failures) == (1, 1, 1.0, 1)
    assert (b.n, b.pass_at_1, b.pass_at_k) == (2, 0.5, 1.0)
    assert r.pass_at_1 == pytest.approx(0.75)
    assert r.summary()["tokens_per_task"] == pytest.approx((10 + 20) / 2)


def test_finish_rate_counts_episodes_that_called_finish_among_scored_ones():
    s = [
        Sample("a", True, 1.0, 10, 3, 0, 1.0, stop_reason="finished"),
        Sample("a", True, 1.0, 10, 6, 0, 1.0, stop_reason="max_turns"),  # passed, but never finished
        Sample("a", False, 0.0, 10, 1, 0, 1.0, infra_failure=True, stop_reason="sandbox_error"),  # not scored
        Sample("b", False, 0.0, 10, 6, 2, 1.0, stop_reason="max_turns"),
    ]
    r = build_report("t", s, k=1)
    assert [t.finish_rate for t in r.tasks] == [0.5, 0.0]
    assert r.summary()["finish_rate"] == pytest.approx(0.25)


def test_stop_reasons_count_why_scored_episodes_ended_per_task_and_overall():
    s = [
        Sample("a", True, 1.0, 10, 3, 0, 1.0, stop_reason="finished"),
        Sample("a", False, 0.0, 10, 6, 0, 300.0, stop_reason="wall_time"),
        Sample("a", False, 0.0, 10, 1, 0, 1.0, infra_failure=True, stop_reason="sandbox_error"),  # not scored
        Sample("b", False, 0.0, 10, 6, 2, 1.0, stop_reason="max_turns"),
        Sample("b", False, 0.0, 10, 6, 2, 1.0, stop_reason="max_turns"),
    ]
    r = build_report("t", s, k=2)
    assert [t.stop_reasons for t in r.tasks] == [{"finished": 1, "wall_time": 1}, {"max_turns": 2}]
    assert r.summary()["stop_reasons"] == {"finished": 1, "wall_time": 1, "max_turns": 2}
    assert r.to_dict()["tasks"][1]["stop_reasons"] == {"max_turns": 2}


def test_infra_errors_say_why_unscored_samples_failed_per_task_overall_and_under_the_table():
    missing = "FileNotFoundError: [Errno 2] No such file or directory: '/x/broken/a'"
    s = [
        Sample("a", False, 0.0, 0, 0, 0, 0.0, infra_failure=True, error=missing),
        Sample("a", False, 0.0, 0, 0, 0, 0.0, infra_failure=True, error=missing),
        Sample("b", True, 1.0, 10, 2, 0, 1.0, stop_reason="finished"),
        Sample("b", False, 0.0, 0, 0, 0, 0.0, infra_failure=True, error="SandboxError: bwrap died"),
    ]
    r = build_report("t", s, k=1)
    assert [t.infra_errors for t in r.tasks] == [{missing: 2}, {"SandboxError: bwrap died": 1}]
    assert list(r.summary()["infra_errors"].items()) == [(missing, 2), ("SandboxError: bwrap died", 1)]
    caption = render_table(r).caption
    assert caption.startswith("3 samples failed in the infrastructure") and f"2x {missing}" in caption
    assert "infrastructure" not in render_table(build_report("t", s[2:3], k=1)).caption  # nothing failed: the legend only
    assert [c.header for c in render_table(r).columns][-1] == "infra"  # unscored samples per task, when there are some
    assert "infra" not in [c.header for c in render_table(build_report("t", s[2:3], k=1)).columns]


def test_outcomes_and_digests_list_each_sample_in_order_with_infra_failures_marked():
    s = [
        Sample("a", True, 1.0, 10, 3, 0, 1.0, digest="d1"),
        Sample("a", False, 0.0, 0, 0, 0, 0.0, infra_failure=True, digest="d2"),
        Sample("a", False, 0.0, 10, 3, 0, 1.0, digest="d3"),
        Sample("b", False, 0.0, 10, 3, 0, 1.0, digest="d4"),
    ]
    r = build_report("t", s, k=1).to_dict()
    assert [(t["outcomes"], t["digests"]) for t in r["tasks"]] == [("1x0", ["d1", "d2", "d3"]), ("0", ["d4"])]


def test_passes_finished_counts_the_passes_that_called_finish():
    """A pass that ran on to the turn limit is a pass, but it never said it was done."""
    s = [
        Sample("a", True, 1.0, 10, 3, 0, 1.0, stop_reason="finished"),
        Sample("a", True, 1.0, 10, 3, 0, 1.0, stop_reason="max_turns"),
        Sample("a", False, 0.0, 0, 0, 0, 0.0, infra_failure=True, stop_reason="sandbox_error"),
        Sample("b", False, 0.0, 10, 3, 0, 1.0, stop_reason="finished"),  # a failed finish does not count
        Sample("b", True, 1.0, 10, 3, 0, 1.0, stop_reason="finished"),
    ]
    r = build_report("t", s, k=1)
    assert [t.finished for t in r.tasks] == ["10x", "11"]
    assert r.summary()["passes_finished"] == pytest.approx(2 / 3)
    assert r.summary()["finish_rate"] == pytest.approx((0.5 + 1.0) / 2)
    assert build_report("t", s[3:4], k=1).summary()["passes_finished"] is None  # no pass: no rate
    older = build_report("t", s[:2], k=1)
    older.tasks[0].finished = ""  # a report written before per-sample finish records
    assert older.summary()["passes_finished"] is None


def test_episode_digest_tells_apart_what_the_policy_wrote():
    from carl.eval.bench import episode_digest
    from carl.types import Trajectory, Turn

    def traj(*texts):
        return Trajectory(task_id="t", turns=[Turn(assistant=x) for x in texts])

    assert episode_digest(traj("a", "b")) == episode_digest(traj("a", "b"))
    assert len({episode_digest(traj("a", "b")), episode_digest(traj("ab")), episode_digest(traj("a", "c"))}) == 3


def test_the_tables_stay_readable_in_80_columns():
    """In a log or an 80-column terminal nothing ends in "…": long task ids wrap, headers stay whole."""
    from rich.console import Console

    from carl.train.loop import print_final_report

    long_id = "an-id-from-another-source/calculator_ops/function/stub/2"  # not the pipeline's form: kept whole
    r = build_report("micro eval", [Sample(long_id, True, 1.0, 10, 3, 0, 1.0, stop_reason="finished")], k=1)
    console = Console(width=80, record=True)
    console.print(render_table(r))
    reports = {"warm_start": {"summary": {"k": 4, "pass@1": 0.389, "pass@4": 0.5, "tokens_per_task": 1234.0,
                                          "tool_calls_per_task": 3.4, "finish_rate": 0.95, "wall_s_per_task": 12.0}}}
    print_final_report(console, reports, __import__("pathlib").Path("/tmp/run"))
    text = console.export_text()
    assert "…" not in text
    for header in ("passed", "pass@1", "tokens", "calls", "done", "done|pass", "wall s", "checkpoint", "warm_start"):
        assert header in text, header
    assert "infra" not in text  # no sample failed in the infrastructure: no column for it
    lines = text.splitlines()
    body = lines[next(i for i, line in enumerate(lines) if "───" in line) + 1:]
    wrapped = "".join(line.split()[0] for line in body[:next(i for i, line in enumerate(body) if not line.strip())])
    assert wrapped == long_id  # the task column's lines, read down: every character of the id
    # the task pipeline's ids (two from one repo) are shortened to one line each, and the legend says how
    ids = ["repo100002__c83d85d9-function-stub-95629aa2", "repo100002__c83d85d9-function-stub-5828b7b9"]
    r = build_report("micro eval", [Sample(t, True, 1.0, 10, 3, 0, 1.0, stop_reason="finished") for t in ids], k=1)
    console = Console(width=80, record=True)
    console.print(render_table(r))
    text = console.export_text()
    rows = [line.split()[0] for line in text.splitlines() if line.strip().startswith("repo")]
    assert rows == ["repo100002:95629aa2", "repo100002:5828b7b9"]
    assert "task: <repo>:<the last part of its id>" in text


def test_short_task_ids_keep_ids_that_fit_or_do_not_parse_or_would_clash():
    from carl.eval.report import short_task_ids

    assert short_task_ids(["toolz__1.0-f-stub-ab12"]) == ["toolz__1.0-f-stub-ab12"]  # fits in 24
    assert short_task_ids(["toolz__1.0.0-function-stub-ab12cd34"]) == ["toolz:ab12cd34"]
    assert short_task_ids(["a-rather-long-task-id-with-no-repo-part", "x__y-z"]) == \
        ["a-rather-long-task-id-with-no-repo-part", "x__y-z"]
    clash = ["toolz__1.0.0-function-stub-ab12cd34", "toolz__1.0.1-function-stub-ab12cd34"]
    assert short_task_ids(clash) == clash
