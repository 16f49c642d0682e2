"""`carl demo`: the scripted expert solves a generated micro task in a bubblewrap sandbox.

Everything on the path is real: a generated repository, the feature-deletion task pipeline
(baseline runs, coverage map, deletion, validation, scrub), a bwrap sandbox, the agent loop with
XML tool calls, and the clean-sandbox test reward with the reward-hacking monitor. Only the
policy is scripted (it knows the gold patch, and makes one recoverable mistake of each kind).
"""

from __future__ import annotations

import argparse
from carl.sandbox.base import BACKENDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="a scripted agent solves a generated repo task in a sandbox (transcript)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--difficulty", type=int, default=2, choices=[1, 2, 3, 4, 5])
    p.add_argument("--sandbox", default="bwrap", choices=list(BACKENDS))
    p.add_argument("--workdir", default=None, help="where to build the task (default: a temp dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import itertools
    import tempfile
    from pathlib import Path

    from rich.console import Console

    from carl.harness.agent import EpisodeLimits, run_episode
    from carl.harness.transcript import render_outcome, render_task, render_turn
    from carl.micro.expert import ExpertMistakes, ExpertPolicy
    from carl.micro.world import build_micro_tasks
    from carl.rewards.episode import reward_from_trajectory
    from carl.rewards.reward import RewardConfig
    from carl.sandbox import open_sandbox
    from carl.sandbox.base import SandboxConfig
    from carl.tasks import broken_repo_dir, sandbox_config_for

    console = Console()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="carl-demo-"))
    with console.status("generating a micro repository and building feature-deletion tasks"):
        world = build_micro_tasks(workdir, args.seed, args.difficulty, {"warm_start": 1},
                                  max_tasks_per_repo=2, backend=args.sandbox)
    task = world["warm_start"][0]
    console.print(f"built {len(world['warm_start'])} validated tasks in {workdir}")
    console.print(render_task(task.instance_id, task.problem_statement))
    policy = ExpertPolicy(task, ExpertMistakes(bad_call=1.0, wrong_edit=1.0), seed=args.seed)
    config = sandbox_config_for(task, SandboxConfig(backend=args.sandbox))
    numbers = itertools.count(1)
    with open_sandbox(broken_repo_dir(task), config) as sandbox:
        traj = run_episode(policy, sandbox, task, EpisodeLimits(max_turns=12),
                           on_turn=lambda turn: console.print(render_turn(turn, next(numbers))))
        console.print(render_outcome(traj))
        r = reward_from_trajectory(traj, task, sandbox, RewardConfig(sandbox=config))
    passed = sum(o == "passed" for o in r.result.tests.values())
    console.print(f"[bold]reward {r.reward:.1f}[/] ({passed}/{len(r.result.tests)} tests pass in a clean sandbox "
                  f"with the original tests); monitor flags: {sorted(r.monitor.kinds()) or 'none'}")
    return 0 if r.reward == 1.0 else 1
