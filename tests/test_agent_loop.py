"""run_episode with a scripted chat policy and an in-memory sandbox: stop reasons, errors as data."""

from __future__ import annotations

import json
import time

import pytest
from agent_fakes import FakeSandbox, file_tools

from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.harness.policies import ScriptedChatPolicy
from carl.harness.prompts import NO_TOOL_CALL_NOTICE
from carl.harness.tools.base import ParamSpec, ToolSpec
from carl.harness.transcript import transcript_text
from carl.tasks.record import TaskRecord
from carl.types import Message, StopReason, Trajectory

TASK = TextTask("demo-1", "Make add() return the sum.")
FINISH = '<tool name="finish"><message>done</message></tool>'


def run(script, files=None, limits=None, **kw):
    sandbox = kw.pop("sandbox", None) or FakeSandbox(files or {"a.py": "def add(a, b):\n    return 0\n"})
    limits = limits or EpisodeLimits()
    return run_episode(ScriptedChatPolicy(script), sandbox, TASK, limits, tools=file_tools(), **kw), sandbox


def test_scripted_episode_edits_and_finishes():
    traj, sandbox = run([
        '<tool name="read_file"><path>a.py</path></tool>',
        '<tool name="write_file"><path>a.py</path><content>def add(a, b):\n    return a + b\n</content></tool>',
        FINISH,
    ])
    assert traj.stop_reason == StopReason.FINISHED and traj.error is None
    assert sandbox.files["a.py"] == b"def add(a, b):\n    return a + b"
    assert [t.calls[0].name for t in traj.turns] == ["read_file", "write_file", "finish"]
    assert "return 0" in traj.turns[0].results[0].output
    msgs = traj.segments[0].messages
    assert msgs[0].role == "system" and "read_file" in msgs[0].content and "finish" in msgs[0].content
    assert msgs[1] == Message("user", "<task>\nMake add() return the sum.\n</task>")
    assert [m.role for m in msgs[2:]] == ["assistant", "tool"] * 3
    assert traj.segments[0].token_ids_T == []  # text-level policy: messages only
    assert traj.task_id == "demo-1" and traj.metadata["num_summaries"] == 0


def test_trajectory_json_round_trip():
    traj, _ = run(['<tool name="read_file"><path>missing.py</path></tool><tool name="bogus"><x>1</x></tool>',
                   FINISH])
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again == traj
    assert again.turns[0].results[1].error.valid_tools == ("read_file", "write_file", "finish")


def test_malformed_calls_become_observations_and_the_loop_goes_on():
    traj, _ = run([
        '<tool name="read_flie"><path>a.py</path></tool>',  # unknown tool
        '<tool name="read_file"><path>a.py</path>',  # unclosed
        '<tool name="read_file"></tool>',  # missing param
        '<tool name="read_file"><path>nope.py</path></tool>',  # execution error
        FINISH,
    ])
    assert traj.stop_reason == StopReason.FINISHED
    kinds = [t.results[0].error.kind for t in traj.turns[:4]]
    assert kinds == ["unknown_tool", "unclosed_tag", "missing_param", "execution"]
    assert [len(t.errors) for t in traj.turns[:4]] == [1, 1, 1, 0]  # parse errors vs execution errors
    unknown_obs = traj.segments[0].messages[3]
    assert unknown_obs.role == "tool" and "read_file, write_file, finish" in unknown_obs.content
    assert traj.num_tool_errors == 4


def test_parallel_calls_come_back_in_call_order_in_one_message():
    files = {f"f{i}.py": f"value_{i} = {i}\n" for i in range(6)}
    calls = "".join(f'<tool name="read_file"><path>f{i}.py</path></tool>' for i in range(6))
    traj, _ = run([calls, FINISH], files=files)
    results = traj.turns[0].results
    assert [r.index for r in results] == list(range(6))
    assert all(f"value_{i}" in r.output for i, r in enumerate(results))
    obs = traj.segments[0].messages[3].content
    positions = [obs.index(f"value_{i}") for i in range(6)]
    assert positions == sorted(positions)


def test_reply_without_tool_call_gets_the_notice():
    traj, _ = run(["Let me think about this.", FINISH])
    assert traj.stop_reason == StopReason.FINISHED
    assert traj.turns[0].calls == [] and traj.turns[0].results == []
    assert traj.segments[0].messages[3] == Message("tool", NO_TOOL_CALL_NOTICE)


def test_stop_on_no_call():
    traj, _ = run(["All done, bye.", FINISH], limits=EpisodeLimits(stop_on_no_call=True))
    assert traj.stop_reason == StopReason.NO_TOOL_CALL and len(traj.turns) == 1


def test_failed_finish_does_not_end_the_episode():
    traj, _ = run(['<tool name="finish"><bogus>1</bogus></tool>', FINISH])
    assert traj.stop_reason == StopReason.FINISHED and len(traj.turns) == 2


def test_max_turns():
    traj, _ = run(['<tool name="read_file"><path>a.py</path></tool>'] * 10, limits=EpisodeLimits(max_turns=3))
    assert traj.stop_reason == StopReason.MAX_TURNS and len(traj.turns) == 3


def test_max_tokens():
    limits = EpisodeLimits(max_tokens=2000)
    traj, _ = run(['<tool name="read_file"><path>a.py</path></tool>' + "x" * 2000] * 10, limits=limits)
    assert traj.stop_reason == StopReason.MAX_TOKENS and 0 < len(traj.turns) < 10


def test_wall_time():
    def slow(messages):
        time.sleep(0.15)
        return '<tool name="read_file"><path>a.py</path></tool>'

    traj, _ = run(slow, limits=EpisodeLimits(wall_time_s=0.2))
    assert traj.stop_reason == StopReason.WALL_TIME and len(traj.turns) == 2


def test_policy_crash_is_an_infra_failure_not_an_exception():
    def script(messages):
        if len(messages) > 2:
            raise ConnectionError("endpoint down")
        return '<tool name="read_file"><path>a.py</path></tool>'

    traj, _ = run(script)
    assert traj.stop_reason == StopReason.POLICY_ERROR and traj.stop_reason.is_infra_failure
    assert "ConnectionError: endpoint down" in traj.error
    assert len(traj.turns) == 1


def test_script_running_out_is_a_policy_error():
    traj, _ = run(['<tool name="read_file"><path>a.py</path></tool>'])
    assert traj.stop_reason == StopReason.POLICY_ERROR and "ScriptExhausted" in traj.error


def test_sandbox_crash_is_an_infra_failure():
    traj, _ = run(['<tool name="read_file"><path>a.py</path></tool>', FINISH], sandbox=FakeSandbox(crash=True))
    assert traj.stop_reason == StopReason.SANDBOX_ERROR and "the sandbox died" in traj.error


def test_on_turn_sees_every_turn_and_transcript_renders():
    seen = []
    traj, _ = run(['<tool name="read_file"><path>a.py</path></tool>', "hmm", FINISH], on_turn=seen.append)
    assert seen == traj.turns
    text = transcript_text(traj, TASK.problem_statement)
    assert "turn 1" in text and "read_file" in text and "finished" in text and "(no tool call)" in text


@pytest.mark.parametrize("field,value", [("max_turns", 0), ("summarize_at_fraction", 1.5),
                                         ("context_budget_tokens", -1), ("max_summaries", -1)])
def test_limits_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"limits.{field}"):
        EpisodeLimits(**{field: value})


class SleepTool:
    spec = ToolSpec(name="sleep", description="sleep a while", params=(ParamSpec("tag", "str", "a label"),))

    def run(self, params, sandbox):
        time.sleep(0.3)
        return f"slept {params['tag']}"


def test_calls_of_one_message_run_in_parallel():
    tools = {**file_tools(), "sleep": SleepTool()}
    calls = "".join(f'<tool name="sleep"><tag>{i}</tag></tool>' for i in range(4))
    traj = run_episode(ScriptedChatPolicy([calls, FINISH]), FakeSandbox(), TASK, EpisodeLimits(), tools=tools)
    assert [r.output for r in traj.turns[0].results] == [f"slept {i}" for i in range(4)]
    assert traj.turns[0].wall_s < 0.9  # 4 x 0.3 s one after another would be 1.2 s


def test_a_task_record_is_a_task():
    record = TaskRecord(instance_id="pkg__1-function-stub-abc", repo="pkg", problem_statement="Rebuild add().")
    traj = run_episode(ScriptedChatPolicy([FINISH]), FakeSandbox(), record, EpisodeLimits(), tools=file_tools())
    assert traj.task_id == "pkg__1-function-stub-abc"
    assert "Rebuild add()." in traj.segments[0].messages[1].content
