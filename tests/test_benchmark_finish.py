"""benchmarks/finish.py: how held-out episodes end, read from a run's eval reports and transcripts."""

import json
import sys

import pytest
from benchmark_modules import load

finish = load("finish")


def _report(outcomes: dict[str, str], digest: str) -> dict:
    tasks = [{"task_id": t, "n": len(o), "infra_failures": 0, "outcomes": o, "pass_at_1": o.count("1") / len(o),
              "digests": [f"{digest}{t}{j}" for j in range(len(o))]} for t, o in outcomes.items()]
    return {"summary": {"pass@1": sum(t["pass_at_1"] for t in tasks) / len(tasks)}, "tasks": tasks}


def _transcript(run, step, index, verdict, task, stop, summary_turn=None):
    heads = "╭─ turn 1 · assistant · segment 0 · 1.0s ─╮\n"
    if summary_turn:
        heads += f"╭─ turn {summary_turn} · summary · segment 0 · 2.0s · cut at the token limit ─╮\n"
    path = run / "transcripts" / f"step{step:05d}_eval_{index:03d}_{verdict}_{task}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"Fix it.\n{heads}stop: {stop} · turns 6\n")


def _run(tmp_path, name, warm, rl, warm_transcripts):
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "step000000.json").write_text(json.dumps(warm))
    (run / "eval" / "step000005.json").write_text(json.dumps(rl))
    if warm_transcripts:
        for i, (verdict, task, stop) in enumerate([("pass", "a", "finished"), ("fail", "a", "finished"),
                                                   ("fail", "b", "max_turns"), ("fail", "b", "finished")]):
            _transcript(run, 0, i, verdict, task, stop)
    return run


def test_done_given_pass_and_resets_with_a_branch_reading_its_sources_warm_transcripts(tmp_path, monkeypatch, capsys):
    warm = _report({"a": "10", "b": "00"}, "w")
    source = _run(tmp_path, "source", warm, _report({"a": "11", "b": "00"}, "s"), warm_transcripts=True)
    for i, (verdict, task, stop) in enumerate([("pass", "a", "finished"), ("pass", "a", "finished"),
                                               ("fail", "b", "finished"), ("fail", "b", "max_turns")]):
        _transcript(source, 5, i, verdict, task, stop)
    branch = _run(tmp_path, "branch", warm, _report({"a": "11", "b": "10"}, "b"), warm_transcripts=False)
    for i, (verdict, task, stop, reset) in enumerate([("pass", "a", "max_turns", 4), ("pass", "a", "finished", None),
                                                      ("pass", "b", "max_turns", 5), ("fail", "b", "max_turns", 4)]):
        _transcript(branch, 5, i, verdict, task, stop, reset)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["finish.py", f"x={source}", f"y={branch}", "--out", str(out)])
    finish.main()
    result = json.loads((out / "finish.json").read_text())
    by_run = {r["arm"]: r for r in result["runs"]}
    assert by_run["y"]["warm"] == by_run["x"]["warm"]  # the branch's copied warm eval, read from its source
    assert by_run["y"]["warm"]["passes_finished"] == 1.0 and by_run["y"]["warm"]["finish_rate"] == 0.75
    rl = by_run["y"]["rl"]
    assert (rl["finish_rate"], rl["passes_finished"]) == (0.25, pytest.approx(1 / 3))
    assert (rl["resets_per_episode"], rl["episodes_with_a_reset"], rl["summaries_cut"]) == (0.75, 3, 3)
    assert by_run["y"]["rl_minus_warm"] == pytest.approx(0.5)
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and {r["run"] for r in rows} == {str(source), str(branch)}
    assert "y: 1 runs" in capsys.readouterr().out


def test_transcripts_that_disagree_with_the_report_are_refused(tmp_path, monkeypatch):
    warm = _report({"a": "11", "b": "00"}, "w")  # the transcripts say sample 0 of a passed and 1 failed
    run = _run(tmp_path, "run", warm, _report({"a": "10", "b": "00"}, "r"), warm_transcripts=True)
    monkeypatch.setattr(sys, "argv", ["finish.py", f"x={run}", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="do not match"):
        finish.main()
