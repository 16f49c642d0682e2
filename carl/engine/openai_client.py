"""A ChatPolicy over any OpenAI-compatible `/v1/chat/completions` endpoint (vLLM, llama.cpp
server, SGLang, hosted APIs), with plain httpx (no `openai` package).

For evaluation and production use without training: trajectories from this policy carry
messages only (the server's tokenization is not visible, so they are not token-exact).

Role mapping: carl's tool observations go out as `user` messages. carl's tools are XML blocks in
the assistant's text, not the API's native function calling, so there are no `tool_call_id`s
for `tool` messages to answer, and many servers reject `tool` messages without one.

Retries: connection errors, timeouts, HTTP 429 and 5xx are retried `max_retries` times with
exponential backoff (honouring a numeric `Retry-After`); any other HTTP error fails at once with
the server's message. Thread-safe: one `httpx.Client` (connection pool) shared by all callers.
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx

from carl.engine.streams import EpisodeChat
from carl.types import Message

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class PolicyError(RuntimeError):
    """The endpoint failed or answered something that is not a chat completion."""


class ChatReply(str):
    """A reply's text that also carries the server's token counts for its request (`usage`:
    prompt_tokens and completion_tokens, {} when the server sent none): a bench prices an API
    model's episodes from them (carl.eval.bench). Everything else reads it as the plain str."""

    usage: dict[str, int]

    def __new__(cls, text: str, usage: Any = None) -> ChatReply:
        reply = super().__new__(cls, text)
        usage = usage if isinstance(usage, dict) else {}
        reply.usage = {k: usage[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(usage.get(k), int)}
        return reply


class OpenAIChatPolicy:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        transport: httpx.BaseTransport | None = None,
        seed: int | None = None,
    ):
        """`base_url` ends in `/v1` (e.g. http://127.0.0.1:8000/v1); `api_key` defaults to
        $OPENAI_API_KEY when set (local servers usually need none); `transport` lets tests
        serve requests in-process; `seed` names the random streams of `episode` views (None: no
        seed is sent, and the server samples as it likes)."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: got {base_url!r}, expected an http(s) URL such as http://127.0.0.1:8000/v1")
        if not model:
            raise ValueError("model: expected a model name, got an empty string")
        if temperature < 0:
            raise ValueError(f"temperature: got {temperature}, expected >= 0")
        if max_retries < 0:
            raise ValueError(f"max_retries: got {max_retries}, expected >= 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.seed = seed
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)

    def chat(self, messages: list[Message], max_new_tokens: int, seed: int | None = None) -> ChatReply:
        """The assistant's reply (with the request's token counts); `seed` is sent as the request's
        sampling seed when given."""
        body = {
            "model": self.model,
            "messages": [{"role": "user" if m.role == "tool" else m.role, "content": m.content} for m in messages],
            "max_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if seed is not None:
            body["seed"] = seed
        data = self._post(body)
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.url}: response is not a chat completion: {str(data)[:300]}") from None
        return ChatReply(content or "", data.get("usage"))  # some servers send null content for an empty reply

    def episode(self, key: str) -> OpenAIChatPolicy | EpisodeChat:
        """One episode's view whose requests carry seeds named by (seed, `key`, turn)
        (`carl.engine.streams`); this policy itself when it has no seed."""
        return self if self.seed is None else EpisodeChat(self, self.seed, key)

    def _post(self, body: dict[str, Any]) -> Any:
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                resp = self.client.post(self.url, json=body)
            except httpx.TransportError as e:  # connection refused, reset, timeouts
                if last:
                    raise PolicyError(
                        f"{self.url}: {type(e).__name__}: {e} (after {attempt + 1} attempts); is the server running?"
                    ) from e
                self._sleep(attempt, None)
                continue
            if resp.status_code == 200:
                try:
                    return resp.json()
                except ValueError:
                    raise PolicyError(f"{self.url}: response is not JSON: {resp.text[:300]!r}") from None
            if resp.status_code not in RETRY_STATUS or last:
                raise PolicyError(
                    f"{self.url}: HTTP {resp.status_code} for model {self.model!r}"
                    f"{f' (after {attempt + 1} attempts)' if attempt else ''}: {resp.text[:500]}"
                )
            self._sleep(attempt, resp.headers.get("retry-after"))
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff_s * 2**attempt
        if retry_after is not None:
            try:
                delay = max(delay, min(float(retry_after), 60.0))  # capped: a stuck rollout is worse
            except ValueError:
                pass  # an HTTP date: keep our own backoff
        time.sleep(delay)

    def close(self) -> None:
        self.client.close()
