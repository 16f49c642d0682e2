"""`carl agent run`: one agent episode over a copy of a repository, transcript shown live.

    carl agent run --repo DIR --task TEXT --checkpoint runs/default --out traj.json
    carl agent run --repo DIR --task TEXT --checkpoint runs/default:8 --seed 1 --out traj.json
    carl agent run --repo DIR --task TEXT --policy openai:http://127.0.0.1:8000/v1#MODEL --out traj.json
    carl agent run --repo DIR --task TEXT --policy scripted:replies.json --sandbox local --out traj.json

Exactly one of `--checkpoint` and `--policy` says what acts:

- `--checkpoint PATH`: a model carl trained, in this process, as its run evaluated it
  (`carl.train.checkpoint_policy`). PATH is a run directory (its latest checkpoint; RUN_DIR:STEP
  for another, as `carl train --branch-from`), a checkpoint folder, or a Hugging Face model
  folder. The run's config.toml gives the sampling (eval temperature, top-p, seed, sampler dtype
  and device), the episode limits, the tools and the sandbox settings; the flags given override
  them. Generation is token-level, through the same chat rendering and engine as training, and
  sample 0 of a task id draws the random numbers that `carl eval` under the same seed uses for
  that task: on the same repository it writes the same episode.
- `--policy openai:URL#MODEL`: any OpenAI-compatible endpoint, text in and out, sampled at
  `--temperature` (default 0: greedy) and `--top-p`, with request seeds named by `--seed`;
  `--policy scripted:FILE`: a JSON list of assistant messages (strings), replayed.

Token-level replies that loop on a short pattern are cut by the repetition guard
(`EpisodeLimits.max_repeat_tokens`, `carl.harness.repetition`); such a turn records
finish_reason "repeat". The trajectory JSON (`Trajectory.to_dict`, with what was loaded and how it
sampled in `metadata`) is written atomically when the episode ends, whatever its stop reason.
Exit status: 0 when the episode ran (any stop reason of the agent's own), 1 on an
infrastructure failure (policy or sandbox error), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    run.add_argument("--checkpoint", metavar="PATH",
                     help="a carl run directory (its latest checkpoint), RUN_DIR:STEP, a checkpoint folder or a "
                          "Hugging Face model folder, run in-process with the run's sampling, limits and tools")
    run.add_argument("--policy", help=POLICY_SCHEMES)
    run.add_argument("--temperature", type=float, default=None,
                     help="sampling temperature, 0 = greedy (default: the run's eval temperature with --checkpoint, "
                          "0 with --policy openai:...)")
    run.add_argument("--top-p", type=float, default=None, help="nucleus mass in (0, 1] (default: the run's, or 1)")
    run.add_argument("--seed", type=int, default=None,
                     help="names the episode's random streams (default: the run's seed with --checkpoint; none "
                          "sent to an endpoint)")
    run.add_argument("--device", default=None, help="--checkpoint: torch device, e.g. cpu or cuda:0 (default: the run's)")
    run.add_argument("--sandbox", choices=list(BACKENDS), default=None,
                     help="sandbox backend (default: the run's with --checkpoint, else bwrap; local isolates "
                          "nothing: development only)")
    run.add_argument("--out", required=True, help="where to write the trajectory JSON")
    run.add_argument("--max-turns", type=int, default=None,
                     help="most assistant messages (default: the run's with --checkpoint, else 50)")
    run.add_argument("--task-id", default="cli", help="instance id recorded in the trajectory (and naming its "
                                                      "random streams: sample 0 of this task)")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from carl.harness.agent import EpisodeLimits, TextTask, run_episode
    from carl.harness.tools import default_tools
    from carl.harness.transcript import render_outcome, render_task, render_turn
    from carl.io import atomic_write_json
    from carl.sandbox import open_sandbox
    from carl.sandbox.base import SandboxConfig, SandboxError

    repo = Path(args.repo)
    if not repo.is_dir():
        raise UserError(f"--repo: {args.repo!r} is not a directory")
    if not args.task.strip():
        raise UserError("--task: expected the task text, got an empty string")
    check_args(args)

    console = Console()
    tools, sandbox_config, metadata = default_tools(), SandboxConfig(backend=args.sandbox or "bwrap"), {}
    if args.checkpoint:
        from carl.train.checkpoint_policy import load_checkpoint_policy

        with console.status(f"loading {args.checkpoint}"):
            policy, limits, info = load_checkpoint_policy(args.checkpoint, temperature=args.temperature,
                                                          top_p=args.top_p, seed=args.seed, device=args.device)
        if info["tools"] is not None:  # the tools the run trained with: its system prompt lists them
            tools = {name: tool for name, tool in tools.items() if name in info["tools"]}
        if info["sandbox"] is not None:
            sandbox_config = dataclasses.replace(info["sandbox"], backend=args.sandbox or info["sandbox"].backend)
        metadata = {"checkpoint": {k: v for k, v in info.items() if k != "sandbox"}}
        console.print(describe_checkpoint(info, limits))
    else:
        policy = parse_policy(args.policy, temperature=args.temperature or 0.0, seed=args.seed,
                              top_p=1.0 if args.top_p is None else args.top_p)
        limits = EpisodeLimits()
        metadata = {"policy": args.policy}
    if args.max_turns is not None:
        limits = dataclasses.replace(limits, max_turns=args.max_turns)
    task = TextTask(args.task_id, args.task)
    # sample 0 of this task: the streams `carl eval` draws for it under the same seed (carl.engine.streams)
    episode_policy = policy.episode(f"{task.instance_id}/0") if hasattr(policy, "episode") else policy

    console.print(render_task(task.instance_id, task.problem_statement))
    try:
        try:
            sandbox = open_sandbox(str(repo), sandbox_config)
        except SandboxError as e:
            raise UserError(f"could not start the {sandbox_config.backend} sandbox: {e}") from None
        numbers = itertools.count(1)
        try:
            traj = run_episode(episode_policy, sandbox, task, limits, tools,
                               on_turn=lambda turn: console.print(render_turn(turn, next(numbers))))
        finally:
            sandbox.close()
    finally:
        if hasattr(policy, "close"):
            policy.close()
    traj.metadata.update(metadata, sandbox=sandbox_config.backend, repo=str(repo.resolve()))
    atomic_write_json(args.out, traj.to_dict())
    console.print(render_outcome(traj))
    console.print(f"trajectory written to {args.out}")
    return 1 if traj.stop_reason.is_infra_failure else 0


def check_args(args: argparse.Namespace) -> None:
    """UserError for arguments that cannot work together or are out of range."""
    if (args.policy is None) == (args.checkpoint is None):
        raise UserError("expected exactly one of --checkpoint PATH (a model carl trained, run in-process) and "
                        f"--policy {POLICY_SCHEMES}; got {'both' if args.policy else 'neither'}")
    if args.max_turns is not None and args.max_turns <= 0:
        raise UserError(f"--max-turns: got {args.max_turns}, expected a positive integer")
    if args.temperature is not None and args.temperature < 0:
        raise UserError(f"--temperature: got {args.temperature:g}, expected >= 0 (0 = greedy)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise UserError(f"--top-p: got {args.top_p:g}, expected a value in (0, 1]")
    if args.policy is not None:
        if args.device is not None:
            raise UserError("--device: only for --checkpoint (an endpoint runs where it is served)")
        given = [f for f, v in (("--temperature", args.temperature), ("--top-p", args.top_p),
                                ("--seed", args.seed)) if v is not None]
        if args.policy.startswith("scripted:") and given:
            raise UserError(f"{', '.join(given)}: a scripted policy replays its file and samples nothing")


def describe_checkpoint(info: dict[str, Any], limits: Any) -> str:
    """One line saying what was loaded and how it samples."""
    source = f"run {info['run_dir']}, step {info['step']}" if info["run_dir"] else "no run config: defaults"
    return (f"checkpoint {info['model']} ({source}): temperature {info['temperature']:g}, top-p {info['top_p']:g}, "
            f"seed {info['seed']}, {info['dtype']} on {info['device']}; limits: {limits.max_turns} turns of "
            f"<= {limits.max_new_tokens} tokens in {limits.context_budget_tokens}, repetition guard "
            f"{limits.max_repeat_tokens or 'off'}")


def parse_policy(spec: str, temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0) -> Any:
    """`openai:URL#MODEL` -> OpenAIChatPolicy (sampling at `temperature` and `top_p`, episode streams
    named by `seed`), `scripted:FILE` -> ScriptedChatPolicy."""
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

        return OpenAIChatPolicy(url, model, temperature=temperature, top_p=top_p, seed=seed)
    raise UserError(f"--policy: unknown scheme {scheme!r} in {spec!r}; expected {POLICY_SCHEMES}")
