"""Self-summarization: crossing the context budget three times and still finishing, every segment kept."""

from __future__ import annotations

import dataclasses

import pytest
from agent_fakes import FakeSandbox, file_tools, tiny_chat_tokenizer
from test_chat_tokens import assert_token_exact

from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.harness.chat_tokens import approx_tokens, render_chat
from carl.harness.policies import ScriptedChatPolicy, ScriptedTokenPolicy, scripted_summary
from carl.harness.prompts import SUMMARY_REQUEST, system_prompt, task_prompt
from carl.harness.protocol import tools_prompt
from carl.types import Message, StopReason, Trajectory

TASK = TextTask("sum-1", "Read all the notes, then finish.")
NUM_FILES = 9
FILES = {f"notes{i}.txt": f"note {i}: " + "the quick brown fox jumps over the lazy dog. " * 24 for i in range(NUM_FILES)}


class Reader:
    """Reads notes0..notes8 one per turn, then finishes; answers summary requests with what it read."""

    def __init__(self, is_summary_request):
        self.is_summary_request = is_summary_request
        self.read = 0
        self.summaries = 0

    def __call__(self, conversation) -> str:
        if self.is_summary_request(conversation):
            self.summaries += 1
            return f"Summary {self.summaries}: I read notes0..notes{self.read - 1}; next is notes{self.read}."
        if self.read == NUM_FILES:
            return '<tool name="finish"><message>read everything</message></tool>'
        self.read += 1
        return f'Reading. <tool name="read_file"><path>notes{self.read - 1}.txt</path></tool>'


def limits_for(prompt_tokens: int) -> EpisodeLimits:
    """A read turn adds ~300 tokens and a resume prompt ~60-125 more than the task prompt (either
    counter): a segment crosses prompt + 850 on its third read, so 9 reads make 3 resets."""
    budget = prompt_tokens + 1600
    return EpisodeLimits(context_budget_tokens=budget, summarize_at_fraction=(prompt_tokens + 850) / budget,
                         max_summaries=3)


def first_messages(tools) -> list[Message]:
    return [Message("system", system_prompt(tools_prompt({n: t.spec for n, t in tools.items()}))),
            Message("user", task_prompt(TASK.problem_statement))]


def check_segments(traj: Trajectory, summaries: list[str]) -> None:
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    assert len(traj.segments) == 4 and traj.metadata["num_summaries"] == 3
    summary_turns = [t for t in traj.turns if t.is_summary]
    assert [t.assistant for t in summary_turns] == summaries
    assert [t.segment for t in summary_turns] == [0, 1, 2]
    for k, seg in enumerate(traj.segments):
        assert seg.messages[0].role == "system"
        assert seg.messages[1].role == "user"
        if k > 0:  # a reset segment starts from system + task + the latest summary
            assert task_prompt(TASK.problem_statement) in seg.messages[1].content
            assert summaries[k - 1] in seg.messages[1].content
        if k < 3:  # a summarized segment ends with the request and the summary
            assert seg.messages[-2] == Message("user", SUMMARY_REQUEST)
            assert seg.messages[-1] == Message("assistant", summaries[k])
    # every file was read exactly once across the segments, and the episode went on after each reset
    reads = [c.params["path"] for t in traj.turns for c in t.calls if c.name == "read_file"]
    assert reads == [f"notes{i}.txt" for i in range(NUM_FILES)]
    assert all(any(t.segment == k and not t.is_summary for t in traj.turns) for k in range(4))


def test_text_policy_summarizes_three_times_and_finishes():
    script = Reader(lambda messages: messages[-1].content == SUMMARY_REQUEST)
    tools = file_tools()
    limits = limits_for(sum(approx_tokens(m.content) for m in first_messages(tools)))
    traj = run_episode(ScriptedChatPolicy(script), FakeSandbox(FILES), TASK, limits, tools=tools)
    summaries = [f"Summary {k}: " for k in (1, 2, 3)]
    assert [t.assistant.split("I read")[0] for t in traj.turns if t.is_summary] == summaries
    check_segments(traj, [t.assistant for t in traj.turns if t.is_summary])
    assert Trajectory.from_dict(traj.to_dict()) == traj


def test_pluggable_token_counter_drives_summarization():
    script = Reader(lambda messages: messages[-1].content == SUMMARY_REQUEST)
    limits = EpisodeLimits(context_budget_tokens=100, summarize_at_fraction=0.5, max_summaries=3)
    # one "token" per message: summarize once a segment holds 50 messages -> never here
    traj = run_episode(ScriptedChatPolicy(script), FakeSandbox(FILES), TASK, limits, tools=file_tools(),
                       count_tokens=lambda text: 1)
    assert traj.stop_reason == StopReason.FINISHED and len(traj.segments) == 1


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"))


def test_token_policy_summary_tokens_are_generated_tokens_of_their_segment(tok):
    tools = file_tools()
    limits = limits_for(len(tok.encode(render_chat(tok, first_messages(tools), False), add_special_tokens=False)))
    script = Reader(lambda prompt: prompt.endswith(SUMMARY_REQUEST + "<|im_end|>\n<|im_start|>assistant\n"))
    policy = ScriptedTokenPolicy(tok, script)
    traj = run_episode(policy, FakeSandbox(FILES), TASK, limits, tools=tools)
    check_segments(traj, [f"Summary {k}: " + s.split(": ", 1)[1] for k, s in
                          enumerate((t.assistant for t in traj.turns if t.is_summary), 1)])
    assert_token_exact(tok, traj, policy)
    for seg in traj.segments[:3]:  # the summary is the last generated span of its segment
        summary_ids = tok.encode(seg.messages[-1].content, add_special_tokens=False) + [tok.eos_token_id]
        generated = [t for t, g in zip(seg.token_ids_T, seg.generated_mask_T) if g]
        assert generated[-len(summary_ids):] == summary_ids
        assert len(seg.token_ids_T) <= limits.context_budget_tokens
    assert traj.num_generated_tokens == sum(sum(s.generated_mask_T) for s in traj.segments) > 0


@pytest.mark.parametrize("max_summaries", [0, 1])
def test_max_summaries_caps_resets(max_summaries):
    script = Reader(lambda messages: messages[-1].content == SUMMARY_REQUEST)
    tools = file_tools()
    limits = limits_for(sum(approx_tokens(m.content) for m in first_messages(tools)))
    limits = dataclasses.replace(limits, max_summaries=max_summaries)
    traj = run_episode(ScriptedChatPolicy(script), FakeSandbox(FILES), TASK, limits, tools=tools)
    assert traj.stop_reason == StopReason.CONTEXT_FULL
    assert len(traj.segments) == max_summaries + 1 == traj.metadata["num_summaries"] + 1


READS = [f'<tool name="read_file"><path>notes{i}.txt</path></tool>' for i in range(NUM_FILES)]
LIST_SCRIPT = READS + ['<tool name="finish"></tool>']


def test_list_scripts_answer_summary_requests_without_losing_their_place(tok):
    tools = file_tools()
    chat_limits = limits_for(sum(approx_tokens(m.content) for m in first_messages(tools)))
    token_limits = limits_for(len(tok.encode(render_chat(tok, first_messages(tools), False), add_special_tokens=False)))
    for policy, limits in [(ScriptedChatPolicy(LIST_SCRIPT), chat_limits),
                           (ScriptedTokenPolicy(tok, LIST_SCRIPT), token_limits)]:
        traj = run_episode(policy, FakeSandbox(FILES), TASK, limits, tools=tools)
        assert traj.stop_reason == StopReason.FINISHED and len(traj.segments) == 4, type(policy)
        assert [t.assistant for t in traj.turns if not t.is_summary] == LIST_SCRIPT
        assert [t.assistant for t in traj.turns if t.is_summary] == [scripted_summary(n) for n in (3, 6, 9)]


@pytest.mark.parametrize("token_level", [False, True])
def test_truncating_context_resets_without_a_summary_and_keeps_the_last_turn(tok, token_level):
    from carl.harness.prompts import truncated_prompt

    tools = file_tools()
    if token_level:
        prompt = len(tok.encode(render_chat(tok, first_messages(tools), False), add_special_tokens=False))
    else:
        prompt = sum(approx_tokens(m.content) for m in first_messages(tools))
    limits = dataclasses.replace(limits_for(prompt), context_strategy="truncate")
    policy = ScriptedTokenPolicy(tok, LIST_SCRIPT) if token_level else ScriptedChatPolicy(LIST_SCRIPT)
    traj = run_episode(policy, FakeSandbox(FILES), TASK, limits, tools=tools)
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    assert not any(t.is_summary for t in traj.turns)  # no summary is asked for
    assert [t.assistant for t in traj.turns] == LIST_SCRIPT
    resets = len(traj.segments) - 1
    assert resets >= 1 and traj.metadata == {"num_summaries": 0, "num_truncations": resets}
    for prev, seg in zip(traj.segments, traj.segments[1:]):
        assert seg.messages[1] == Message("user", truncated_prompt(TASK.problem_statement))
        assert seg.messages[2:4] == prev.messages[-2:]  # the last turn: its reply and its tool output
        assert [m.role for m in seg.messages[2:4]] == ["assistant", "tool"]
    if token_level:
        for k, seg in enumerate(traj.segments):  # token-exact; the kept reply is prompt text, not sampled
            assert seg.token_ids_T == tok.encode(render_chat(tok, seg.messages, False), add_special_tokens=False)
            sampled = [m for m in seg.messages[2 if k == 0 else 4:] if m.role == "assistant"]
            ids = [i for m in sampled for i in tok.encode(m.content, add_special_tokens=False) + [tok.eos_token_id]]
            assert [t for t, g in zip(seg.token_ids_T, seg.generated_mask_T) if g] == ids


def test_unknown_context_strategy_is_refused():
    with pytest.raises(ValueError, match="limits.context_strategy"):
        EpisodeLimits(context_strategy="drop")
