"""`carl agent run`: one agent episode over a copy of a repository, transcript shown live.

    carl agent run --repo DIR --task TEXT --policy openai:http://127.0.0.1:8000/v1#MODEL --out traj.json
    carl agent run --repo DIR --task TEXT --policy scripted:replies.json --sandbox local --out traj.json

A scripted policy file is a JSON list of assistant messages (strings). The trajectory JSON
(`Trajectory.to_dict`) is written atomically when the episode ends, whatever its stop reason.
Exit status: 0 when the episode ran (any stop reason of the agent's own), 1 on an
infrastructure failure (policy or sandbox error), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

from carl.errors import UserError
from carl.sandbox.base import BACKENDS

POLICY_SCHEMES = "openai:URL#MODEL (e.g. openai:http://127.0.0.1:8000/v1#my-model) or scripted:FILE"


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("agent", help="run the agent harness on a repository")
    sub = group.add_subparsers(dest="agent_command", metavar="COMMAND")
    group.set_defaults(func=lambda args: group.print_help() or 2)

    run = sub.add_parser("run", help="run one agent episode and write its trajectory")
    run.add_argument("--repo", required=True, help="repository directory (the sandbox works on a copy)")
    run.add_argument("--task", required=True, help="the task, as text")
    run.add_argument("--policy", required=True, help=POLICY_SCHEMES)
    run.add_argument("--sandbox", choices=list(BACKENDS), default="bwrap",
                     help="sandbox backend (local isolates nothing: development only)")
    run.add_argument("--out", required=True, help="where to write the trajectory JSON")
    run.add_argument("--max-turns", type=int, default=None, help="most assistant messages (default: 50)")
    run.add_argument("--task-id", default="cli", help="instance id recorded in the trajectory")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.harness.agent import EpisodeLimits, TextTask, run_episode
    from carl.harness.transcript import render_outcome, render_task, render_turn
    from carl.io import atomic_write_json
    from carl.sandbox import open_sandbox
    from carl.sandbox.base import SandboxConfig, SandboxError

    repo = Path(args.repo)
    if not repo.is_dir():
        raise UserError(f"--repo: {args.repo!r} is not a directory")
    if not args.task.strip():
        raise UserError("--task: expected the task text, got an empty string")
    if args.max_turns is not None and args.max_turns <= 0:
        raise UserError(f"--max-turns: got {args.max_turns}, expected a positive integer")
    policy = parse_policy(args.policy)
    limits = EpisodeLimits() if args.max_turns is None else EpisodeLimits(max_turns=args.max_turns)
    task = TextTask(args.task_id, args.task)

    console = Console()
    console.print(render_task(task.instance_id, task.problem_statement))
    try:
        sandbox = open_sandbox(str(repo), SandboxConfig(backend=args.sandbox))
    except SandboxError as e:
        raise UserError(f"could not start the {args.sandbox} sandbox: {e}") from None
    numbers = itertools.count(1)
    try:
        traj = run_episode(policy, sandbox, task, limits,
                           on_turn=lambda turn: console.print(render_turn(turn, next(numbers))))
    finally:
        sandbox.close()
    traj.metadata.update(policy=args.policy, sandbox=args.sandbox, repo=str(repo.resolve()))
    atomic_write_json(args.out, traj.to_dict())
    console.print(render_outcome(traj))
    console.print(f"trajectory written to {args.out}")
    return 1 if traj.stop_reason.is_infra_failure else 0


def parse_policy(spec: str, temperature: float = 0.0, seed: int | None = None) -> Any:
    """`openai:URL#MODEL` -> OpenAIChatPolicy (sampling at `temperature`, episode streams named by
    `seed`), `scripted:FILE` -> ScriptedChatPolicy."""
    scheme, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise UserError(f"--policy: got {spec!r}, expected {POLICY_SCHEMES}")
    if scheme == "scripted":
        from carl.harness.policies import ScriptedChatPolicy

        return ScriptedChatPolicy.from_file(rest)
    if scheme == "openai":
        url, sep, model = rest.rpartition("#")
        if not sep or not url or not model:
            raise UserError(f"--policy: got {spec!r}, expected openai:URL#MODEL with the model name after '#'")
        if not url.startswith(("http://", "https://")):
            raise UserError(f"--policy: got URL {url!r}, expected http://... or https://... (e.g. http://127.0.0.1:8000/v1)")
        from carl.engine.openai_client import OpenAIChatPolicy

        return OpenAIChatPolicy(url, model, temperature=temperature, seed=seed)
    raise UserError(f"--policy: unknown scheme {scheme!r} in {spec!r}; expected {POLICY_SCHEMES}")
