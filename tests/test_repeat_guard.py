"""The repetition guard: the rule itself, the harness's cut (scripted token policies that loop), and
the HF engine's early stop, which must give the same ids as the harness's cut of a full generation."""

from __future__ import annotations

import pytest
import torch
from agent_fakes import FakeSandbox, file_tools
from tiny_hf import save_tiny_model, tiny_tokenizer

from carl.engine.hf import HFEngine, HFEngineConfig
from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.harness.chat_tokens import TokenContext
from carl.harness.policies import ScriptedTokenPolicy
from carl.harness.repetition import RepeatGuard, max_period, repeat_cut
from carl.harness.transcript import transcript_text
from carl.types import Message, StopReason, Trajectory

LOOP = '<tool name="read_file"><path>src/' + "/v" * 2000 + "</path></tool>"  # the production failure
FINISH = '<tool name="finish"><message>done</message></tool>'


def test_a_short_pattern_repeated_over_the_window_fires_at_its_last_id():
    assert repeat_cut([7] * 10, 8) == 8  # period 1
    assert repeat_cut([1, 2, 3, 4] + [5, 6, 9] * 10, 12) == 4 + 12  # period 3, after a non-repeating start
    assert repeat_cut(list(range(100)), 8) is None
    assert repeat_cut([5, 6] * 100, 0) is None  # 0 = off


def test_a_pattern_must_fit_four_times_and_be_at_most_64_ids():
    assert max_period(16) == 4 and max_period(4096) == 64
    assert repeat_cut(list(range(5)) * 4, 16) is None  # period 5 > 16 // 4: a repeated line, not a loop
    long = list(range(100, 165))  # 65 ids
    assert repeat_cut(long * 10, 512) is None
    assert repeat_cut(long[:64] * 10, 512) == 512
    with pytest.raises(ValueError, match="max_repeat_tokens"):
        RepeatGuard(3)
    with pytest.raises(ValueError, match="limits.max_repeat_tokens"):
        EpisodeLimits(max_repeat_tokens=2)


def test_the_harness_cuts_a_looping_reply_and_records_why():
    tok = tiny_tokenizer()
    ctx = TokenContext(ScriptedTokenPolicy(tok, [LOOP]))
    seg = ctx.start([Message("system", "s"), Message("user", "u")])
    full = tok.encode(LOOP, add_special_tokens=False)
    content = ctx.generate(4096, 100_000, max_repeat_tokens=64)
    sampled = [t for t, g in zip(seg.token_ids_T, seg.generated_mask_T) if g]
    assert ctx.finish_reason == "repeat"
    assert sampled == full[:repeat_cut(full, 64)] and len(sampled) < 64 + 20
    assert content.startswith('<tool name="read_file"><path>src//v/v') and seg.messages[-1].content == content
    assert len(seg.logprobs_T) == len(seg.generated_mask_T) == len(seg.token_ids_T)
    assert seg.token_ids_T[-2:] == tok.encode("<|im_end|>\n") and not any(seg.generated_mask_T[-2:])  # template-closed
    ctx2 = TokenContext(ScriptedTokenPolicy(tok, [LOOP]))
    ctx2.start([Message("system", "s"), Message("user", "u")])
    ctx2.generate(4096, 100_000)  # off: the whole reply
    assert ctx2.finish_reason == "stop" and sum(ctx2.segment.generated_mask_T) == len(full) + 1


def test_an_episode_goes_on_after_a_cut_turn_and_the_trajectory_keeps_the_marker():
    tok = tiny_tokenizer()
    limits = EpisodeLimits(max_turns=4, max_new_tokens=4096, context_budget_tokens=100_000, max_repeat_tokens=128)
    traj = run_episode(ScriptedTokenPolicy(tok, [LOOP, FINISH]), FakeSandbox({"a.py": "x = 1\n"}),
                       TextTask("t", "Fix it."), limits, tools=file_tools())
    assert traj.stop_reason == StopReason.FINISHED
    assert [t.finish_reason for t in traj.turns] == ["repeat", "stop"]
    assert traj.turns[0].errors and traj.turns[0].errors[0].kind == "unclosed_tag"  # its observation says so
    assert traj.num_generated_tokens < 128 + 20 + len(tok.encode(FINISH)) + 1
    again = Trajectory.from_dict(traj.to_dict())
    assert [t.finish_reason for t in again.turns] == ["repeat", "stop"]
    assert "cut: it repeated itself" in transcript_text(traj)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    torch.set_num_threads(1)
    e = HFEngine(HFEngineConfig(path=str(save_tiny_model(tmp_path_factory.mktemp("tiny"))), dtype="float32",
                                temperature=0.0))
    yield e
    e.close()


PROMPTS = [[1, 5, 9, 12, 40, 41, 42, 7], [1, 7, 3], [1, 20, 21, 22, 23, 24], [1, 2]]


def test_the_engine_stops_a_looping_row_early_with_the_ids_the_harness_would_keep(engine):
    """Greedy decoding of a random tiny model falls into loops: the guarded request ends where the
    guard fires on the unguarded one, with the same ids and log-probs."""
    window, checked = 32, 0
    for prompt in PROMPTS:
        full = engine.generate(prompt, 300, [])
        cut = repeat_cut(full.token_ids, window)
        if cut is None:
            continue
        guarded = engine.generate(prompt, 300, [], max_repeat_tokens=window)
        assert guarded.finish_reason == "repeat" and guarded.token_ids == full.token_ids[:cut]
        assert guarded.logprobs == pytest.approx(full.logprobs[:cut], abs=1e-4)  # prefix reuse: last bits
        assert cut < 300  # the row left the batch there: the engine returns what it decoded
        checked += 1
    assert checked, "no prompt looped under greedy decoding: the test checks nothing"


def test_an_engine_that_stops_early_and_one_that_runs_on_give_the_same_trajectory(engine):
    """The harness cuts what an engine returns where the guard fires (an engine without an early
    stop, like a vLLM server), so both kinds record the same segment."""
    class RunsOn:  # ignores the guard, as VLLMEngine does
        tokenizer = engine.tokenizer

        def generate(self, prompt_ids, max_new_tokens, stop_ids, max_repeat_tokens=0):
            return engine.generate(prompt_ids, max_new_tokens, stop_ids, seed=1)

    class StopsEarly(RunsOn):
        def generate(self, prompt_ids, max_new_tokens, stop_ids, max_repeat_tokens=0):
            return engine.generate(prompt_ids, max_new_tokens, stop_ids, seed=1, max_repeat_tokens=max_repeat_tokens)

    segments = []
    for policy in (RunsOn(), StopsEarly()):
        ctx = TokenContext(policy, stop_ids=[])  # no stop id: only the budget or the guard ends a reply
        ctx.start([Message("system", "s"), Message("user", "u")])
        reasons = []
        for _ in range(3):
            ctx.generate(300, 100_000, max_repeat_tokens=16)
            reasons.append(ctx.finish_reason)
            ctx.add(Message("tool", "ok"))
        segments.append((ctx.segment.token_ids_T, ctx.segment.generated_mask_T, ctx.segment.messages, reasons))
    assert segments[0] == segments[1]
    assert "repeat" in segments[0][3]
