import io
import threading

from rich.console import Console

from carl.eval.paired import in_words, over_tasks, paired_difference
from carl.train.loop import rl_gain_lines, step_line
from carl.train.progress import RunProgress, time_table


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_log_gets_a_line_per_phase_start_quarter_and_end():
    console, out = _log_console()
    with RunProgress(console) as p:
        p.phase("eval warm start", 8, "episodes")
        for _ in range(8):
            p.advance()
        p.phase("RL step 1/2", 4, "rollouts")
        p.advance(2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "[progress] eval warm start: 0/8 episodes"
    assert [ln.split(" in ")[0] for ln in lines[1:4]] == [
        "[progress] eval warm start: 2/8 episodes", "[progress] eval warm start: 4/8 episodes",
        "[progress] eval warm start: 6/8 episodes"]
    assert lines[4].startswith("[progress] eval warm start: 8/8 episodes in ") and lines[4].endswith("(done)")
    assert lines[5] == "[progress] RL step 1/2: 0/4 rollouts"
    assert lines[6].startswith("[progress] RL step 1/2: 2/4 rollouts in ") and "ETA" in lines[6]
    assert lines[7].endswith("(done)") and len(lines) == 8  # the context's exit ends the open phase


def test_work_reported_from_many_threads_is_all_counted_and_the_phase_can_grow_and_be_renamed():
    console, out = _log_console()
    with RunProgress(console) as p:
        p.phase("RL step 1/3", 40, "rollouts")
        threads = [threading.Thread(target=lambda: [p.advance() for _ in range(10)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.grow(8)
        p.describe("RL step 2/3")
        p.end()
    assert out.getvalue().splitlines()[-1].startswith("[progress] RL step 2/3: 40/48 rollouts in ")


def test_a_terminal_gets_a_live_bar_without_errors():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with RunProgress(console) as p:
        p.phase("warm start epoch 1/3", 3, "batches")
        p.advance()
        console.print("a line printed beside the bar")
        p.advance(2)
    text = out.getvalue()
    assert "warm start epoch 1/3" in text and "3/3" in text and "a line printed beside the bar" in text


def _report(outcomes: dict[str, str]) -> dict:
    return {"tasks": [{"task_id": t, "n": len(o), "infra_failures": 0, "outcomes": o} for t, o in outcomes.items()]}


def test_rl_gain_lines_give_the_paired_difference_its_standard_error_over_tasks_and_a_verdict():
    warm = _report({f"t{i}": "00" for i in range(10)})
    rl = _report({**{f"t{i}": "11" for i in range(8)}, "t8": "00", "t9": "00"})
    text = rl_gain_lines(warm, rl)
    # per-task differences: eight 1s and two 0s -> mean 0.8, sd 0.4216, SE over tasks 0.133
    assert "+0.800 ± 0.133" in text and "tasks better/worse 8/0" in text
    assert "RL beat the warm start beyond noise" in text and "resolves gains of about 0.27" in text
    same = rl_gain_lines(warm, warm)
    assert "scored the same on every task" in same


def test_over_tasks_counts_the_spread_of_per_task_differences():
    d = paired_difference(_report({"a": "0101", "b": "0000"}), _report({"a": "1111", "b": "0011"}))
    assert d.diff == 0.5
    t = over_tasks(d)  # per-task differences 0.5 and 0.5: no spread over tasks
    assert t.diff == 0.5 and t.se_paired == 0.0


def test_in_words():
    assert in_words(0.2, 0.05, "RL", "warm") == "RL beat warm beyond noise (4.0 standard errors)"
    assert in_words(-0.2, 0.05, "RL", "warm") == "RL scored below warm beyond noise (4.0 standard errors)"
    assert in_words(0.05, 0.05, "RL", "warm") == "within noise: RL - warm is 1.0 standard errors from 0 (needs 2)"


def test_an_rl_step_line_fits_an_80_column_log_unwrapped():
    metrics = {"rl/reward_mean": -0.25, "rl/pass_rate": 1.0, "rl/tool_error_rate": 0.48, "loss/total": -0.0421,
               "time/step_s": 1234.4, "time/rollout_wait_s": 987.0}
    line = step_line("RL step 12/12", metrics)
    assert line == "RL step 12/12: reward -0.25 pass 1.00 errors 0.48 loss -0.0421 1234s, 987s idle"
    out = io.StringIO()
    Console(file=out, width=80).print(line, highlight=False)
    assert out.getvalue() == line + "\n"


def test_phases_of_one_group_add_up_and_the_table_accounts_for_the_whole_run(monkeypatch):
    import carl.train.progress as progress_mod

    now = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: now[0])
    console, out = _log_console()
    with RunProgress(console) as p:
        now[0] += 5  # loading the model: before any phase
        for epoch in (1, 2):
            p.phase(f"warm start epoch {epoch}/2", 4, "batches", group="warm start")
            p.advance(4)
            now[0] += 30
        p.phase("eval warm start (2 held-out tasks x 2)", 4, "episodes", group="eval warm start")
        p.advance(4)
        now[0] += 20
        p.end()
        now[0] += 5  # a checkpoint: between phases
        p.phase("RL step 1/2", 8, "rollouts", group="RL")
        p.advance(8)
        p.describe("RL step 2/2")
        now[0] += 40
    record = p.time_record()
    assert record["total_s"] == 130.0
    assert [(ph["group"], ph["wall_s"], ph["done"], ph["unit"]) for ph in record["phases"]] == [
        ("warm start", 60.0, 8, "batches"), ("eval warm start", 20.0, 4, "episodes"), ("RL", 40.0, 8, "rollouts")]
    console, out = _log_console()
    console.print(time_table(p.time_record()))
    text = out.getvalue()
    assert "warm start" in text and "1:00" in text and "46%" in text
    assert "between phases" in text and "0:10" in text and "8%" in text  # the model's load and the checkpoint
    assert "total" in text and "2:10" in text


def test_the_time_table_fits_an_80_column_log():
    with RunProgress(_log_console()[0]) as p:
        p.phase("micro world (generated repos -> feature deletion -> validation)", 72, "repos", group="micro world")
        p.advance(72)
    console = Console(file=io.StringIO(), force_terminal=False, width=80)
    console.print(time_table(p.time_record()))
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and any("micro world" in line and "72 repos" in line for line in lines)


def test_each_process_of_a_run_adds_its_time_to_time_json(tmp_path):
    import json

    from carl.train.loop import keep_time

    path = tmp_path / "time.json"
    keep_time(path, {"total_s": 10.0, "phases": [{"group": "RL", "wall_s": 9.0, "done": 8, "unit": "rollouts"}]})
    keep_time(path, {"total_s": 3.0, "phases": []})  # a resumed run's process
    kept = json.loads(path.read_text())["processes"]
    assert [k["total_s"] for k in kept] == [10.0, 3.0] and kept[0]["phases"][0]["group"] == "RL" and kept[0]["revision"]
    path.write_text("{cut short")  # a file a crash left unreadable: started again, not a crash at the end of a run
    keep_time(path, {"total_s": 1.0, "phases": []})
    assert [k["total_s"] for k in json.loads(path.read_text())["processes"]] == [1.0]
