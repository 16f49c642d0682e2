"""A simulated production: scripted users who ask `carl serve` for work and judge it by tests.

    provision(tasks, ...)  one workspace per (user, task): a copy of the task's broken repo under
                           workspaces/<user>/<workspace>, a token per user in the users file
    SimUser.act(client, task)
        a fresh request: the user's checkout starts as the broken repo again (the workspace the
        service copies for the session, which no session changes)
        open a session on the workspace, send the task's problem statement, read the stream
        apply the returned edits to the user's own checkout (a patch that does not apply = nothing)
        run the task's tests on it (the same clean-sandbox reward as training: FAIL_TO_PASS and
        PASS_TO_PASS), then tell the service what happened:
            tests    1 / 0
            kept     the edit stays (tests pass)      or   reverted (they fail; checkout restored)
            followup when unhappy, a message naming the failing tests (the hint self-distillation uses)

Every request starts from the broken repo, so every round of traffic asks the same questions: a
checkout that kept an earlier fix would make every later patch for that task conflict (the
service's workspace is still broken) and count as reverted. Before this reset, 0 of 74 requests
on a task the user had kept a fix for were kept, in three runs, whatever the model did: the
kept-edit rate of each later version fell, and its training data called correct fixes failures
(docs/results/online/stale_checkouts.py).

A user keeps an edit only when the tests pass, so an edit that is easy to keep but does nothing,
a reply with broken tool calls, or a clarifying question instead of an attempt is reverted: it
can never look better than an honest failure. Driving the service over HTTP with these users is
the end-to-end test of the production loop (tests/test_online_service.py) and what `carl online`
measures kept-edit rates on.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carl.harness.policies import ScriptedTokenPolicy
from carl.micro.expert import ExpertPolicy
from carl.online.auth import add_user
from carl.online.client import ServeClient
from carl.rewards.reward import RewardConfig, compute_reward
from carl.sandbox import open_sandbox
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord, broken_repo_dir
from carl.tasks.patch import PatchError, apply_patch


@dataclass(frozen=True)
class SimUser:
    name: str
    token: str
    checkouts: Path
    """The user's own copies of their workspaces (what their editor has open)."""


class ExpertEngine:
    """A scripted token engine for the simulated production: its episodes play the micro expert
    (carl.micro.expert) of the task their prompt names, so a load test measures the service, its
    sandboxes and its store rather than a model; `lazy` episodes finish at once without an edit (a
    model that learned to skip the work); `slow_s` is slept before each reply (model latency)."""

    def __init__(self, tokenizer, tasks, lazy=False, slow_s=0.0):
        self.tokenizer, self.tasks, self.lazy, self.slow_s = tokenizer, tasks, lazy, slow_s
        self.policy_version = 0
        self.keys: list[str] = []

    def episode(self, key):
        self.keys.append(key)
        experts = {}

        def reply(prompt: str) -> str:
            time.sleep(self.slow_s)
            if self.lazy:
                return '<tool name="finish"><param name="summary">done</param></tool>'
            task = next(t for t in self.tasks if t.problem_statement[:200] in prompt)
            expert = experts.setdefault(task.instance_id, ExpertPolicy(task))
            return expert.reply(False)

        return ScriptedTokenPolicy(self.tokenizer, reply)

    def update_weights(self, version):
        time.sleep(0.05)
        self.policy_version = version


def workspace_name(task: TaskRecord) -> str:
    """A workspace name for a task (its id with anything outside [A-Za-z0-9._-] replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", task.instance_id)[:120].lstrip("._-") or "workspace"


def provision(tasks: list[TaskRecord], users: list[str], workspaces: Path, users_file: Path, home: Path,
              admin: str | None = "carl-online") -> tuple[list[SimUser], str | None]:
    """Give every user a workspace per task (the broken repo) and a token; returns the users and
    the admin's token (None without an admin)."""
    made = []
    for name in users:
        token = add_user(users_file, name)
        for task in tasks:
            src = broken_repo_dir(task)
            shutil.copytree(src, Path(workspaces) / name / workspace_name(task), symlinks=True)
            shutil.copytree(src, Path(home) / name / workspace_name(task), symlinks=True)
        made.append(SimUser(name, token, Path(home) / name))
    return made, add_user(users_file, admin, admin=True) if admin else None


def act(user: SimUser, client: ServeClient, task: TaskRecord, sandbox: SandboxConfig,
        reward: RewardConfig = RewardConfig()) -> dict[str, Any]:
    """One request of `user` on `task`, judged and signalled; returns what happened."""
    workspace = workspace_name(task)
    checkout = user.checkouts / workspace
    shutil.rmtree(checkout, ignore_errors=True)  # a fresh request (module docstring)
    shutil.copytree(broken_repo_dir(task), checkout, symlinks=True)
    t0 = time.monotonic()
    session = client.open_session(workspace)
    done = client.run(session["id"], task.problem_statement)
    latency = time.monotonic() - t0
    index = done["request"]
    backup = checkout.with_name(checkout.name + ".before")
    shutil.rmtree(backup, ignore_errors=True)
    shutil.copytree(checkout, backup, symlinks=True)
    applied = True
    try:
        apply_patch(checkout, done["edits"])
    except (PatchError, OSError, IndexError):
        applied = False
    passed, failing = judge(task, checkout, sandbox, reward) if applied and done["edits"] else (False, [])
    client.signal(session["id"], index, "tests", value=1.0 if passed else 0.0)
    if passed:
        client.signal(session["id"], index, "kept", value=1.0)
    else:
        client.signal(session["id"], index, "reverted", value=1.0)
        shutil.rmtree(checkout)
        shutil.copytree(backup, checkout, symlinks=True)
        client.signal(session["id"], index, "followup", value=1.0, text=followup_text(done, failing))
    shutil.rmtree(backup, ignore_errors=True)
    return {"user": user.name, "task": task.instance_id, "session": session["id"], "request": index,
            "passed": passed, "stop_reason": done["stop_reason"], "latency_s": latency,
            "model_version": done["model_version"], "turns": len(done["turns"])}


def judge(task: TaskRecord, checkout: Path, sandbox: SandboxConfig, reward: RewardConfig) -> tuple[bool, list[str]]:
    """The task's tests on the user's checkout, in a clean sandbox: (all pass, failing test ids)."""
    with open_sandbox(str(checkout), sandbox) as box:
        result = compute_reward(task, box, dataclasses.replace(reward, sandbox=sandbox))
    failing = [t for t, outcome in result.tests.items() if outcome != "passed"]
    return result.reward == 1.0 and not result.infra_failure, failing


def followup_text(done: dict[str, Any], failing: list[str]) -> str:
    if not done["edits"]:
        return "You did not change anything. Please make the change I asked for."
    if failing:
        return f"That did not work: these tests still fail: {', '.join(failing[:5])}."
    return "Your change does not apply to my checkout."


def kept_rate(outcomes: list[dict[str, Any]]) -> tuple[float, float]:
    """Fraction of requests whose edit was kept, and its standard error (binomial)."""
    n = len(outcomes)
    if n == 0:
        return 0.0, 0.0
    p = sum(o["passed"] for o in outcomes) / n
    return p, (p * (1 - p) / n) ** 0.5 if n > 1 else 0.0


