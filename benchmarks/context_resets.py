"""Where do context resets happen? The scripted expert on micro tasks under given episode limits.

    .venv/bin/python benchmarks/context_resets.py                         # the default limits
    .venv/bin/python benchmarks/context_resets.py limits.summarize_at_fraction=0.55
    .venv/bin/python benchmarks/context_resets.py --config configs/long-horizon.toml --level 5

For each task of a small micro world (built in a temp dir), one expert episode (no planted mistakes)
with the run config's limits and tools: how it ended, its segments' token counts, and after which
turn each reset came (turn 0 is the read, 1 the edit, 2 the test run, for a plan without mistakes).
A reset right after the read is one where the summary has to carry what the file said. Printed as
one line per episode and a count per (resets, turns) pattern.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="a TOML config (default: the embedded default)")
    parser.add_argument("--level", type=int, default=None, help="micro level (default: the config's)")
    parser.add_argument("--repos", type=int, default=4)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. limits.summarize_at_fraction=0.55")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from carl.config import load_config
    from carl.harness.agent import run_episode
    from carl.harness.tools import default_tools
    from carl.micro.expert import expert_token_policy
    from carl.micro.world import build_micro_tasks
    from carl.sandbox import open_sandbox
    from carl.tasks import broken_repo_dir, sandbox_config_for
    from carl.train.config import TrainConfig
    from carl.train.loop import resolve_model_path

    cfg = load_config(TrainConfig, args.config, args.overrides)
    level = args.level or cfg.micro.difficulty
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model.path))
    tools = {n: t for n, t in default_tools().items() if n in cfg.tools}
    work = Path(tempfile.mkdtemp(prefix="carl-resets-"))
    tasks = build_micro_tasks(work, cfg.micro.seed, level, {"warm_start": args.repos},
                              max_tasks_per_repo=cfg.micro.max_tasks_per_repo, backend=cfg.sandbox.backend)["warm_start"]
    print(f"level {level}, {len(tasks)} tasks, tools {sorted(tools)}, limits {cfg.limits}")
    patterns: collections.Counter = collections.Counter()
    for task in tasks:
        policy = expert_token_policy(tokenizer, task, summary=cfg.warm_start.expert_summary)
        with open_sandbox(broken_repo_dir(task), sandbox_config_for(task, cfg.sandbox)) as sandbox:
            traj = run_episode(policy, sandbox, task, cfg.limits, tools)
        work_turns = [t for t in traj.turns if not t.is_summary]
        after = [sum(not u.is_summary for u in traj.turns[:i]) - 1 for i, t in enumerate(traj.turns) if t.is_summary]
        resets = len(traj.segments) - 1
        print(f"{task.instance_id}  {traj.stop_reason.value:12s} segments {[len(s.token_ids_T) for s in traj.segments]} "
              f"turns {len(work_turns)} resets {resets} after turns {after}")
        patterns[(traj.stop_reason.value, resets, tuple(after))] += 1
    print("\nepisodes  stop  resets  after turns")
    for (stop, resets, after), n in sorted(patterns.items()):
        print(f"{n:8d}  {stop}  {resets}  {list(after)}")


if __name__ == "__main__":
    main()
