"""Token-exact contexts: the ids a TokenPolicy sees, built incrementally, never re-tokenized.

One segment's ids grow in three kinds of steps (mask: which ids the model sampled):

    start([system, user])  ids  = encode(render([system, user]))                        mask False
    add(message)           ids += encode(render(messages + [message]) - render(messages)) mask False
    generate()             ids += encode(generation prompt: render(messages, True) - render(messages))
                           ids += the sampled ids, exactly as sampled (with log-probs;   mask True
                                  cut where the repetition guard fires, carl.harness.repetition)
                           ids += encode(what the template writes after the sampled text
                                         to close the assistant turn, e.g. "\n")        mask False

The generation prompt is added only when the policy is about to generate, so a user message (the
summary request) can follow a tool message. Only template text is ever encoded; sampled text is
decoded (to record the assistant message) but never encoded again, so training sees what the
model sampled, even a non-canonical tokenization. Each step checks the *prefix property*: the
template's rendering of the longer conversation must start with the text the context already
holds; a template that rewrites earlier turns (e.g. drops past reasoning blocks, trims content)
breaks it and raises ChatTemplateError instead of silently training on ids the model never saw.

Invariant when the sampled ids are canonical (checked by tests/test_chat_tokens.py):

    token_ids_T == encode(render(messages, add_generation_prompt=False))

`ChatContext` is the same interface for text-level policies: messages only, tokens estimated by
a pluggable counter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from carl.harness.policies import ChatPolicy, TokenPolicy
from carl.harness.repetition import repeat_cut
from carl.types import Message, Segment


class ChatTemplateError(RuntimeError):
    """The tokenizer's chat template breaks the prefix property (see module docstring)."""


class ContextFull(Exception):
    """No room is left in the segment's context budget for another generation."""


def approx_tokens(text: str) -> int:
    """Default token counter for text-level policies: about 4 characters per token."""
    return (len(text) + 3) // 4


class TokenContext:
    """One segment at a time of token-exact context for a TokenPolicy."""

    def __init__(self, policy: TokenPolicy, stop_ids: Sequence[int] | None = None):
        self.policy = policy
        self.tokenizer = policy.tokenizer
        if stop_ids is None:
            if self.tokenizer.eos_token_id is None:
                raise ChatTemplateError("the policy's tokenizer has no eos_token_id; pass stop_ids explicitly")
            stop_ids = [self.tokenizer.eos_token_id]
        self.stop_ids = list(stop_ids)
        self.segment = Segment()
        self.finished_tokens = 0  # tokens of earlier segments
        self.finish_reason = ""  # why the last generation ended ("stop", "length", "repeat")
        self._text = ""  # the text that self.segment.token_ids_T stands for

    @property
    def num_tokens(self) -> int:
        return len(self.segment.token_ids_T)

    @property
    def total_tokens(self) -> int:
        return self.finished_tokens + self.num_tokens

    def start(self, messages: list[Message]) -> Segment:
        """Begin a new segment with `messages` (system + user)."""
        self.finished_tokens += self.num_tokens
        self.segment = Segment(messages=list(messages))
        self._text = ""
        self._append_template(self._render(messages, add_generation_prompt=False))
        return self.segment

    def generate(self, max_new_tokens: int, max_context_tokens: int, max_repeat_tokens: int = 0) -> str:
        """Sample the next assistant message, at most `max_new_tokens` and never past
        `max_context_tokens` in all, cut where the repetition guard fires (`max_repeat_tokens`,
        0 = off; `carl.harness.repetition`); returns its text (sampled text without the stop
        token). `finish_reason` then says why it ended ("stop", "length" or "repeat")."""
        self._append_template(self._render(self.segment.messages, add_generation_prompt=True))
        max_new_tokens = min(max_new_tokens, max_context_tokens - self.num_tokens)
        if max_new_tokens <= 0:
            raise ContextFull(f"{self.num_tokens} tokens in context, budget {max_context_tokens}")
        guard = {"max_repeat_tokens": max_repeat_tokens} if max_repeat_tokens else {}  # off: the base protocol call
        gen = self.policy.generate(list(self.segment.token_ids_T), max_new_tokens, self.stop_ids, **guard)
        ids = list(gen.token_ids)
        if len(gen.logprobs) != len(ids):
            raise ValueError(f"policy returned {len(ids)} token ids but {len(gen.logprobs)} logprobs")
        if not ids or len(ids) > max_new_tokens:
            raise ValueError(f"policy returned {len(ids)} token ids, expected 1 to {max_new_tokens}")
        ends_with_stop = ids[-1] in self.stop_ids
        # an engine that stopped early ends exactly at the cut; one that ran on is cut here
        cut = repeat_cut(ids[:-1] if ends_with_stop else ids, max_repeat_tokens)
        if cut is not None:
            ids, ends_with_stop = ids[:cut], False
        self.finish_reason = "repeat" if cut is not None else "stop" if ends_with_stop else "length"
        content = self._decode(ids[:-1] if ends_with_stop else ids)
        sampled_text = content + (self._decode(ids[-1:]) if ends_with_stop else "")
        seg = self.segment
        if gen.routing is not None:  # one span per generation: where its tokens start in the context
            seg.routing = seg.routing or {"spans": []}
            seg.routing["spans"].append({"start": len(seg.token_ids_T), "length": len(ids), "data": gen.routing})
        start = len(seg.token_ids_T)
        for version, n in gen.versions:
            n = min(n, len(ids) - (start - len(seg.token_ids_T)))  # runs past a cut are dropped
            if n > 0:
                seg.versions.append([start, n, version])
                start += n
        seg.token_ids_T += ids
        seg.logprobs_T += [float(x) for x in gen.logprobs[:len(ids)]]
        seg.generated_mask_T += [True] * len(ids)
        self._text += sampled_text
        seg.messages.append(Message("assistant", content))
        # close the assistant turn as the template does (e.g. "\n" after <|im_end|>, or the
        # end-of-turn token itself when the policy stopped on length)
        self._append_template(self._render(seg.messages, add_generation_prompt=False))
        return content

    def add(self, message: Message) -> None:
        """Append a tool or user message."""
        self.segment.messages.append(message)
        self._append_template(self._render(self.segment.messages, add_generation_prompt=False))

    def _append_template(self, full: str) -> None:
        """Append the ids of `full` beyond the text the context already holds (template text only)."""
        if not full.startswith(self._text):
            at = next((i for i, (a, b) in enumerate(zip(full, self._text)) if a != b), min(len(full), len(self._text)))
            raise ChatTemplateError(
                "the chat template does not extend the conversation it rendered before (prefix property "
                f"broken at character {at}): context holds ...{self._text[max(at - 40, 0):at + 40]!r}, template "
                f"renders ...{full[max(at - 40, 0):at + 40]!r}. Token-exact rollouts need a template that renders "
                "earlier turns the same way whatever follows them."
            )
        new_ids = self.tokenizer.encode(full[len(self._text):], add_special_tokens=False)
        seg = self.segment
        seg.token_ids_T += new_ids
        seg.logprobs_T += [0.0] * len(new_ids)
        seg.generated_mask_T += [False] * len(new_ids)
        self._text = full

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return render_chat(self.tokenizer, messages, add_generation_prompt)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def render_chat(tokenizer: Any, messages: list[Message], add_generation_prompt: bool) -> str:
    """The chat template's text for `messages`."""
    return tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


class ChatContext:
    """The same interface for a ChatPolicy: the segment holds messages only, tokens are estimated."""

    def __init__(self, policy: ChatPolicy, count_tokens: Callable[[str], int] = approx_tokens):
        self.policy = policy
        self.count_tokens = count_tokens
        self.segment = Segment()
        self.num_tokens = 0
        self.finished_tokens = 0
        self.finish_reason = ""  # a chat endpoint does not say why its reply ended

    @property
    def total_tokens(self) -> int:
        return self.finished_tokens + self.num_tokens

    def start(self, messages: list[Message]) -> Segment:
        self.finished_tokens += self.num_tokens
        self.segment, self.num_tokens = Segment(), 0
        for m in messages:
            self.add(m)
        return self.segment

    def generate(self, max_new_tokens: int, max_context_tokens: int, max_repeat_tokens: int = 0) -> str:
        """The policy's next reply; `max_repeat_tokens` is unused (the guard needs token ids)."""
        max_new_tokens = min(max_new_tokens, max_context_tokens - self.num_tokens)
        if max_new_tokens <= 0:
            raise ContextFull(f"about {self.num_tokens} tokens in context, budget {max_context_tokens}")
        reply = self.policy.chat(list(self.segment.messages), max_new_tokens)
        if not isinstance(reply, str):
            raise TypeError(f"ChatPolicy.chat returned {type(reply).__name__}, expected str")
        self.add(Message("assistant", reply))
        return reply

    def add(self, message: Message) -> None:
        self.segment.messages.append(message)
        self.num_tokens += self.count_tokens(message.content)
