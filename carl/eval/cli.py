"""`carl eval --checkpoint DIR --tasks FILE`: pass@1, pass@k, tokens, tool calls, wall time per task."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a checkpoint or endpoint on tasks (pass@1, pass@k, ...)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a checkpoint dir (runs/X/checkpoints/step_N) or a HF model folder")
    src.add_argument("--policy", help="openai:URL#MODEL for an OpenAI-compatible endpoint")
    p.add_argument("--tasks", required=True, help="tasks JSONL (carl tasks build output)")
    p.add_argument("--samples", type=int, default=4, help="samples per task (n); pass@k uses k = n")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--sandbox", default="bwrap", choices=["bwrap", "local"])
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--tools", default="", help="comma-separated tool names (default: all)")
    p.add_argument("--out", default="eval_report.json", help="where to write the JSON report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from carl.errors import UserError
    from carl.eval.bench import evaluate
    from carl.eval.report import render_table
    from carl.harness.agent import EpisodeLimits
    from carl.harness.tools import default_tools
    from carl.io import atomic_write_json
    from carl.sandbox.base import SandboxConfig
    from carl.tasks import load_tasks

    if args.samples < 1:
        raise UserError(f"--samples: got {args.samples}, expected >= 1")
    if not Path(args.tasks).is_file():
        raise UserError(f"--tasks: {args.tasks!r} does not exist")
    tasks = load_tasks(args.tasks)
    tools = default_tools()
    if args.tools:
        unknown = sorted(set(args.tools.split(",")) - set(tools))
        if unknown:
            raise UserError(f"--tools: unknown {unknown}; expected names from {sorted(tools)}")
        tools = {k: v for k, v in tools.items() if k in args.tools.split(",")}
    limits = EpisodeLimits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    policy = _policy(args)
    console = Console()
    report, _ = evaluate(Path(args.checkpoint or args.policy).name, lambda i: policy, tasks, args.samples, limits,
                         tools, SandboxConfig(backend=args.sandbox))
    console.print(render_table(report))
    atomic_write_json(args.out, report.to_dict())
    console.print(f"report written to {args.out}")
    if hasattr(policy, "close"):
        policy.close()
    return 0


def _policy(args):
    from pathlib import Path

    from carl.errors import UserError

    if args.policy:
        from carl.harness.cli import parse_policy

        return parse_policy(args.policy)
    path = Path(args.checkpoint)
    if (path / "model" / "config.json").is_file():
        path = path / "model"
    if not (path / "config.json").is_file():
        raise UserError(f"--checkpoint: {args.checkpoint!r} holds no model (expected config.json in it or in model/)")
    from carl.policy.hf import HFPolicy, HFPolicyConfig

    return HFPolicy(HFPolicyConfig(path=str(path), temperature=args.temperature))
