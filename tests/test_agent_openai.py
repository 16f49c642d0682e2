"""OpenAIChatPolicy against an in-process fake server (httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx
import pytest
from agent_fakes import FakeSandbox, file_tools

from carl.harness.agent import EpisodeLimits, TextTask, run_episode
from carl.engine.openai_client import OpenAIChatPolicy, PolicyError
from carl.types import Message, StopReason


class FakeServer:
    """Answers /v1/chat/completions; `failures` is a list of status codes (or "drop") served first."""

    def __init__(self, replies: list[str], failures: list = ()):
        self.replies = list(replies)
        self.failures = list(failures)
        self.requests: list[dict] = []
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        self.requests.append(json.loads(request.content))
        self.headers.append(request.headers)
        if self.failures:
            failure = self.failures.pop(0)
            if failure == "drop":
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(failure, text=f"error {failure}")
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant",
                                                                   "content": self.replies.pop(0)}}]})


def policy(server: FakeServer, **kw) -> OpenAIChatPolicy:
    return OpenAIChatPolicy("http://fake:8000/v1/", "tiny", transport=httpx.MockTransport(server), backoff_s=0.0,
                            **kw)


def test_request_body_and_role_mapping():
    server = FakeServer(["hi"])
    msgs = [Message("system", "s"), Message("user", "u"), Message("assistant", "a"), Message("tool", "obs")]
    assert policy(server, api_key="sk-test", temperature=0.7).chat(msgs, 123) == "hi"
    body = server.requests[0]
    assert body["model"] == "tiny" and body["max_tokens"] == 123 and body["temperature"] == 0.7
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][3]["content"] == "obs"
    assert server.headers[0]["authorization"] == "Bearer sk-test"


def test_retries_transient_failures_then_succeeds():
    server = FakeServer(["ok"], failures=[503, "drop", 429])
    assert policy(server, max_retries=3).chat([Message("user", "u")], 10) == "ok"
    assert len(server.requests) == 4


def test_gives_up_after_max_retries_with_a_clear_error():
    server = FakeServer(["never"], failures=[500, 500, 500])
    with pytest.raises(PolicyError, match=r"HTTP 500 .*after 3 attempts"):
        policy(server, max_retries=2).chat([Message("user", "u")], 10)


def test_client_errors_are_not_retried():
    server = FakeServer(["never"], failures=[400])
    with pytest.raises(PolicyError, match="HTTP 400 for model 'tiny': error 400"):
        policy(server, max_retries=5).chat([Message("user", "u")], 10)
    assert len(server.requests) == 1


def test_not_a_chat_completion():
    def handler(request):
        return httpx.Response(200, json={"error": "nope"})

    p = OpenAIChatPolicy("http://fake/v1", "m", transport=httpx.MockTransport(handler))
    with pytest.raises(PolicyError, match="not a chat completion"):
        p.chat([Message("user", "u")], 10)


def test_bad_arguments():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIChatPolicy("localhost:8000", "m")
    with pytest.raises(ValueError, match="model"):
        OpenAIChatPolicy("http://x/v1", "")


def test_episode_over_the_endpoint_and_endpoint_down_is_policy_error():
    server = FakeServer(['<tool name="read_file"><path>a.py</path></tool>', '<tool name="finish"></tool>'])
    traj = run_episode(policy(server), FakeSandbox({"a.py": "x = 1\n"}), TextTask("t", "look"), EpisodeLimits(),
                       tools=file_tools())
    assert traj.stop_reason == StopReason.FINISHED
    assert server.requests[1]["messages"][-1]["role"] == "user"  # the tool observation
    assert "x = 1" in server.requests[1]["messages"][-1]["content"]

    down = FakeServer([], failures=["drop", "drop"])
    traj = run_episode(policy(down, max_retries=1), FakeSandbox(), TextTask("t", "look"), EpisodeLimits(),
                       tools=file_tools())
    assert traj.stop_reason == StopReason.POLICY_ERROR and "is the server running?" in traj.error


def test_episode_views_send_seeds_named_by_seed_key_and_turn():
    """Eval episodes over an endpoint carry per-turn seeds (`carl.engine.streams`): the same episode
    key repeats its seeds, another key or seed does not; a policy without a seed sends none."""
    server = FakeServer(["a"] * 10)
    p = policy(server, seed=5)
    for key in ("t/0", "t/0", "t/1"):
        ep = p.episode(key)
        ep.chat([Message("user", "u")], 8)
        ep.chat([Message("user", "u")], 8)
    seeds = [r["seed"] for r in server.requests]
    assert seeds[:2] == seeds[2:4] and seeds[0] != seeds[1]  # turn 0 and 1 of "t/0", twice
    assert set(seeds[4:]).isdisjoint(seeds[:4]) and all(0 <= s < 2**31 for s in seeds)
    policy(server, seed=6).episode("t/0").chat([Message("user", "u")], 8)
    assert server.requests[-1]["seed"] != seeds[0]
    unseeded = policy(server)
    assert unseeded.episode("t/0") is unseeded
    unseeded.chat([Message("user", "u")], 8)
    assert "seed" not in server.requests[-1]


def test_carl_eval_passes_temperature_and_seed_to_the_endpoint():
    import argparse

    from carl.commands.eval import load_policy

    p = load_policy(argparse.Namespace(policy="openai:http://127.0.0.1:9/v1#m", temperature=0.7, seed=3))
    assert (p.temperature, p.seed, p.model) == (0.7, 3, "m")
    p.close()
