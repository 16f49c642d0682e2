"""Token-exact contexts: the recorded ids are exactly what the template renders plus what was sampled."""

from __future__ import annotations

import pytest
from agent_fakes import CHATML_TEMPLATE, FakeSandbox, file_tools, tiny_chat_tokenizer

from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.harness.chat_tokens import ChatTemplateError, TokenContext, render_chat
from carl.harness.policies import Generation, ScriptedTokenPolicy
from carl.types import Message, StopReason, Trajectory


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_chat_tokenizer(tmp_path_factory.mktemp("tok"))


def rendered_ids(tokenizer, messages: list[Message]) -> list[int]:
    text = render_chat(tokenizer, messages, add_generation_prompt=False)
    return tokenizer.encode(text, add_special_tokens=False)


def assert_token_exact(tokenizer, traj: Trajectory, policy: ScriptedTokenPolicy) -> None:
    for seg in traj.segments:
        assert seg.token_ids_T == rendered_ids(tokenizer, seg.messages)
        assert len(seg.logprobs_T) == len(seg.generated_mask_T) == len(seg.token_ids_T)
        # the mask covers exactly the sampled tokens: each assistant message's canonical ids + <|im_end|>
        sampled = [tokenizer.encode(m.content, add_special_tokens=False) + [tokenizer.eos_token_id]
                   for m in seg.messages if m.role == "assistant"]
        assert [t for t, g in zip(seg.token_ids_T, seg.generated_mask_T) if g] == [i for s in sampled for i in s]
        assert all(lp == 0.0 for lp, g in zip(seg.logprobs_T, seg.generated_mask_T) if not g)
        expected_lps = [-0.01 * (k + 1) for s in sampled for k in range(len(s))]
        assert [lp for lp, g in zip(seg.logprobs_T, seg.generated_mask_T) if g] == pytest.approx(expected_lps)
    # every prompt the policy saw is a prefix of its segment's final ids
    for prompt in policy.prompts:
        assert any(seg.token_ids_T[: len(prompt)] == prompt for seg in traj.segments)


def test_episode_ids_equal_chat_template_rendering(tokenizer):
    script = [
        'I will look first. <tool name="read_file"><path>src/app.py</path></tool>',
        'Two calls: <tool name="read_file"><path>src/app.py</path></tool><tool name="nope"></tool>',
        "no call here, just thinking",
        '<tool name="write_file"><path>a.py</path><content>\ndef add(a, b):\n    return a + b\n\n</content></tool>',
        '<tool name="finish"><message>done</message></tool>',
    ]
    policy = ScriptedTokenPolicy(tokenizer, script)
    sandbox = FakeSandbox({"src/app.py": "x = 1\n"})
    traj = run_episode(policy, sandbox, TextTask("t1", "fix add"), EpisodeLimits(), tools=file_tools())
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    assert len(traj.segments) == 1 and len(traj.turns) == 5
    assert_token_exact(tokenizer, traj, policy)
    assert sandbox.files["a.py"] == b"def add(a, b):\n    return a + b\n"
    roles = [m.role for m in traj.segments[0].messages]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 5
    assert Trajectory.from_dict(traj.to_dict()) == traj


def test_sampled_ids_are_never_retokenized(tokenizer):
    """A non-canonical sample (one token per character) stays exactly as sampled."""
    prompt = [Message("system", "s"), Message("user", "u")]
    text = "the quick brown fox"
    char_ids = [tokenizer.convert_tokens_to_ids(c if c != " " else "Ġ") for c in text]
    assert char_ids != tokenizer.encode(text, add_special_tokens=False)  # BPE merges these

    class CharPolicy:
        def __init__(self):
            self.tokenizer = tokenizer

        def generate(self, prompt_ids, max_new_tokens, stop_ids):
            return Generation(char_ids + [stop_ids[0]], [-1.0] * (len(char_ids) + 1), "stop")

    ctx = TokenContext(CharPolicy())
    seg = ctx.start(prompt)
    assert ctx.generate(64, 10_000) == text
    n_gen_prompt = len(tokenizer.encode(render_chat(tokenizer, prompt, True), add_special_tokens=False))
    sampled = [t for t, g in zip(seg.token_ids_T, seg.generated_mask_T) if g]
    assert sampled == char_ids + [tokenizer.eos_token_id]
    assert seg.token_ids_T[n_gen_prompt: n_gen_prompt + len(sampled)] == sampled
    ctx.add(Message("tool", "ok"))
    assert seg.messages[-2] == Message("assistant", text)
    # the observation ids after the sample are the template's suffix, exactly
    tail = render_chat(tokenizer, seg.messages, False)[len(render_chat(tokenizer, seg.messages[:-1], False)):]
    assert seg.token_ids_T[n_gen_prompt + len(sampled) + 1:] == tokenizer.encode(tail, add_special_tokens=False)


def test_length_stop_closes_the_turn_with_template_tokens(tokenizer):
    policy = ScriptedTokenPolicy(tokenizer, ["the quick brown fox jumps over the lazy dog"])
    ctx = TokenContext(policy)
    seg = ctx.start([Message("system", "s"), Message("user", "u")])
    content = ctx.generate(3, 10_000)
    assert sum(seg.generated_mask_T) == 3
    assert seg.token_ids_T == rendered_ids(tokenizer, seg.messages)
    assert seg.messages[-1] == Message("assistant", content)
    # <|im_end|> was written by the template, not sampled
    eos_positions = [i for i, t in enumerate(seg.token_ids_T) if t == tokenizer.eos_token_id]
    assert not seg.generated_mask_T[eos_positions[-1]]


def test_routing_spans_point_at_their_generation(tokenizer):
    class RoutedPolicy(ScriptedTokenPolicy):
        def generate(self, prompt_ids, max_new_tokens, stop_ids):
            gen = super().generate(prompt_ids, max_new_tokens, stop_ids)
            return Generation(gen.token_ids, gen.logprobs, gen.finish_reason, routing=f"r{len(self.prompts)}")

    ctx = TokenContext(RoutedPolicy(tokenizer, ["a", "bb"]))
    seg = ctx.start([Message("system", "s"), Message("user", "u")])
    ctx.generate(10, 10_000)
    ctx.add(Message("tool", "x"))
    ctx.generate(10, 10_000)
    spans = seg.routing["spans"]
    assert [s["data"] for s in spans] == ["r1", "r2"]
    for span in spans:
        assert all(seg.generated_mask_T[span["start"]: span["start"] + span["length"]])
    assert sum(s["length"] for s in spans) == sum(seg.generated_mask_T)


def test_template_that_rewrites_history_is_a_clear_error(tokenizer, tmp_path):
    # renders only the last message: earlier turns disappear once a new one is added
    bad = ("{{'<|im_start|>' + messages[-1]['role'] + '\n' + messages[-1]['content'] + '<|im_end|>\n'}}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    tok = tiny_chat_tokenizer(tmp_path, template=bad)
    ctx = TokenContext(ScriptedTokenPolicy(tok, ["hello"]))
    ctx.start([Message("system", "s"), Message("user", "u")])
    with pytest.raises(ChatTemplateError, match="prefix property"):
        ctx.generate(10, 10_000)
    # inside an episode it is an infrastructure failure, not an exception
    traj = run_episode(ScriptedTokenPolicy(tok, ["hello"]), FakeSandbox(), TextTask("t", "x"), EpisodeLimits(),
                       tools=file_tools())
    assert traj.stop_reason == StopReason.POLICY_ERROR
    assert "ChatTemplateError" in traj.error and "prefix property" in traj.error


def test_fixture_template_is_chatml(tokenizer):
    assert tokenizer.chat_template == CHATML_TEMPLATE
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"


@pytest.mark.slow  # ~20 s: parses the tokenizer out of the 90 MB GGUF file
def test_smollm2_tokenizer_and_template_are_token_exact():
    from transformers import AutoTokenizer

    from carl.engine.smollm2 import GGUF_FILE, find_gguf

    gguf = find_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=GGUF_FILE)
    script = [
        'Let me read it: <tool name="read_file"><path>src/app.py</path></tool>',
        "Hmm, 2 * (x + 1) < y && z; naïve café ✓",
        '<tool name="finish"><message>done</message></tool>',
    ]
    policy = ScriptedTokenPolicy(tok, script)
    traj = run_episode(policy, FakeSandbox({"src/app.py": "def f(x):\n    return x  # ünïcode\n"}),
                       TextTask("t", "Fix f."), EpisodeLimits(), tools=file_tools())
    assert traj.stop_reason == StopReason.FINISHED, traj.error
    assert_token_exact(tok, traj, policy)
