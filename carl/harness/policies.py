"""What drives an agent: two small protocols, and deterministic scripted policies for tests and demos.

- `ChatPolicy`: messages in, assistant text out. Any OpenAI-compatible endpoint
  (`carl.engine.openai_client.OpenAIChatPolicy`) and `ScriptedChatPolicy` implement it.
  Trajectories of chat policies carry messages only (no token ids).
- `TokenPolicy`: token ids in, sampled token ids and their log-probs out, plus the `tokenizer`
  whose chat template frames the conversation. The trainer's models implement it; the harness
  builds the context ids itself (`carl.harness.chat_tokens`), so trajectories are token-exact.
  `generate` is called from several episodes (threads) at once: implementations must be
  thread-safe (the trainer batches concurrent calls behind its own queue).

Scripted policies are the "deterministic fake model" of the tests and the demo: the same script
always produces the same trajectory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from carl.errors import UserError
from carl.harness.prompts import SUMMARY_REQUEST
from carl.types import Message


@runtime_checkable
class ChatPolicy(Protocol):
    def chat(self, messages: list[Message], max_new_tokens: int) -> str:
        """The assistant's next message for this conversation (at most about `max_new_tokens`)."""
        ...


@dataclass(frozen=True)
class Generation:
    """What a TokenPolicy sampled for one turn."""

    token_ids: list[int]
    """The sampled ids, in order, including the stop id when the policy stopped on one."""
    logprobs: list[float]
    """Log-prob of each sampled id under the sampling policy (same length as token_ids)."""
    finish_reason: Literal["stop", "length", "repeat"]
    """"stop": the last id is one of `stop_ids`; "length": `max_new_tokens` were sampled; "repeat":
    the repetition guard fired at the last id (`carl.harness.repetition`)."""
    routing: Any = None
    """MoE router replay: the policy's compact record of top-k expert ids per sampled token
    and layer (opaque to the harness, stored per generation in `Segment.routing`)."""
    versions: tuple[tuple[int, int], ...] = ()
    """Which weights version sampled which tokens, as (version, number of tokens) runs in order
    (summing to len(token_ids)); several runs when a weight update landed mid-generation (an
    engine that keeps requests running across updates). Empty: the policy has no versions."""


@runtime_checkable
class TokenPolicy(Protocol):
    tokenizer: Any
    """A Hugging Face tokenizer with a chat template."""

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int]) -> Generation:
        """Sample a continuation of `prompt_ids`, stopping after any id in `stop_ids`.

        With the repetition guard on, the harness also passes `max_repeat_tokens=N` (keyword): a
        policy may stop as soon as `carl.harness.repetition.RepeatGuard(N)` fires (finish_reason
        "repeat"), or ignore it: the harness cuts the generation at the same id either way."""
        ...


class ScriptExhausted(RuntimeError):
    """A scripted policy was asked for more replies than its script holds."""


Script = Sequence[str] | Callable[[list[Message]], str]
"""A list of assistant messages replayed in order, or a function of the conversation so far."""


class ScriptedChatPolicy:
    """Replays a script of assistant messages; deterministic.

    With a list script, a request for a self-summary (the last message is `SUMMARY_REQUEST`) is
    answered with a fixed summary without consuming a reply, so a replayed script stays in step
    whatever the context budget. A callable script sees every request, summaries included.
    """

    def __init__(self, script: Script):
        self.script = script
        self.calls = 0  # replies consumed from a list script

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedChatPolicy:
        """A JSON file holding a list of assistant messages: strings, or {"content": ...} objects."""
        return cls(load_script(path))

    def chat(self, messages: list[Message], max_new_tokens: int) -> str:
        if callable(self.script):
            return self.script(messages)
        if messages and messages[-1].content == SUMMARY_REQUEST:
            return scripted_summary(self.calls)
        if self.calls >= len(self.script):
            raise ScriptExhausted(f"the script has only {len(self.script)} replies; reply {self.calls + 1} asked for")
        reply = self.script[self.calls]
        self.calls += 1
        return reply


class ScriptedTokenPolicy:
    """A TokenPolicy that emits the canonical tokenization of scripted assistant messages.

    Each reply is `tokenizer.encode(text)` followed by the first stop id, with log-prob
    `-0.01 * (position + 1)` per token (deterministic, distinct, so tests can check alignment).
    A callable script receives the decoded prompt text (template markup included). A list script
    answers summary requests (the prompt ends with `SUMMARY_REQUEST` and the template's framing)
    as ScriptedChatPolicy does.
    """

    def __init__(self, tokenizer: Any, script: Sequence[str] | Callable[[str], str]):
        self.tokenizer = tokenizer
        self.script = script
        self.calls = 0
        self.prompts: list[list[int]] = []  # every prompt seen, for tests

    def generate(self, prompt_ids: list[int], max_new_tokens: int, stop_ids: Sequence[int],
                 max_repeat_tokens: int = 0) -> Generation:
        """The next scripted reply; `max_repeat_tokens` is left to the harness (TokenContext cuts)."""
        self.prompts.append(list(prompt_ids))
        text = self._next_reply(prompt_ids)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [stop_ids[0]]
        finish: Literal["stop", "length"] = "stop"
        if len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
        return Generation(ids, [-0.01 * (i + 1) for i in range(len(ids))], finish)

    def _next_reply(self, prompt_ids: list[int]) -> str:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        if callable(self.script):
            return self.script(prompt)
        # the request is the last message; only the template's framing (< 100 chars) follows it
        if SUMMARY_REQUEST in prompt[-len(SUMMARY_REQUEST) - 100 :]:
            return scripted_summary(self.calls)
        if self.calls >= len(self.script):
            raise ScriptExhausted(f"the script has only {len(self.script)} replies; reply {self.calls + 1} asked for")
        self.calls += 1
        return self.script[self.calls - 1]


def scripted_summary(num_replies: int) -> str:
    return f"Summary: I have sent {num_replies} scripted replies so far and will continue with the next step."


def load_script(path: str | Path) -> list[str]:
    """Read a scripted-policy file: a JSON list of strings or of {"content": str} objects."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"scripted policy file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"scripted policy file {str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise UserError(f"scripted policy file {str(p)!r}: expected a non-empty JSON list of assistant messages")
    replies = []
    for i, item in enumerate(data):
        if isinstance(item, dict):
            item = item.get("content")
        if not isinstance(item, str):
            raise UserError(
                f"scripted policy file {str(p)!r}: item {i} should be a string or an object with a "
                f'string "content", got {data[i]!r:.80}'
            )
        replies.append(item)
    return replies
