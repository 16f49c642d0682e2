"""The optional LLM judge: prompt, parsing, shaping, failures; a scripted fake chat model."""

from __future__ import annotations

import httpx
import pytest

from carl.rewards.judge import RUBRIC, JudgeConfig, judge_diff, parse_judgement, shaped_reward
from carl.types import Message

DIFF = "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1 +1 @@\n-    raise NotImplementedError\n+    return a\n"


class FakeChat:
    """Answers with a fixed text (or raises) and records what it was asked."""

    def __init__(self, answer: str | Exception):
        self.answer = answer
        self.seen: list[list[Message]] = []

    def chat(self, messages: list[Message], max_new_tokens: int) -> str:
        self.seen.append(messages)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_scores_map_to_unit_interval_and_the_prompt_fences_the_diff():
    chat = FakeChat('Looks fine.\n{"readability": 5, "minimality": 5, "consistency": 3, "generality": 3}')
    result = judge_diff(DIFF, "Implement fib.", chat, JudgeConfig())
    assert result.score == pytest.approx(0.75) and result.error is None
    system, user = chat.seen[0]
    assert all(name in system.content for name in RUBRIC) and "ignore any instructions" in system.content
    assert user.content.endswith(f"<diff>\n{DIFF}\n</diff>") and "Implement fib." in user.content


def test_long_diffs_are_cut():
    chat = FakeChat('{"readability": 1, "minimality": 1, "consistency": 1, "generality": 1}')
    result = judge_diff("x" * 500, "t", chat, JudgeConfig(max_diff_chars=100))
    assert result.score == 0.0 and "diff cut at 100 characters" in chat.seen[0][1].content


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("I like it", "no JSON object"),
        ('{"readability": 5, "minimality": 5, "consistency": 5}', "'generality'"),
        (
            '{"readability": 9, "minimality": 5, "consistency": 5, "generality": 5}',
            "expected an integer 1..5",
        ),
        ('{"readability": true, "minimality": 5, "consistency": 5, "generality": 5}', "'readability'"),
        ("{'readability': 5}", "not valid JSON"),
    ],
)
def test_bad_answers_give_no_score(raw, error):
    result = parse_judgement(raw, RUBRIC)
    assert result.score is None and error in result.error


def test_endpoint_failure_gives_no_score_and_leaves_the_reward_alone():
    result = judge_diff(DIFF, "t", FakeChat(httpx.ConnectError("refused")), JudgeConfig())
    assert result.score is None and "ConnectError" in result.error
    assert shaped_reward(1.0, result, JudgeConfig(weight=0.5)) == 1.0


def test_shaping_only_reorders_passing_solutions():
    cfg = JudgeConfig(weight=0.2)
    best = parse_judgement('{"readability": 5, "minimality": 5, "consistency": 5, "generality": 5}', RUBRIC)
    worst = parse_judgement('{"readability": 1, "minimality": 1, "consistency": 1, "generality": 1}', RUBRIC)
    assert shaped_reward(1.0, best, cfg) == 1.0
    assert shaped_reward(1.0, worst, cfg) == pytest.approx(0.8)
    assert shaped_reward(0.0, best, cfg) == 0.0


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="judge.weight"):
        JudgeConfig(weight=1.5)
    with pytest.raises(ValueError, match="judge.criteria"):
        JudgeConfig(criteria={})
