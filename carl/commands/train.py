"""`carl train [CONFIG.toml] [a.b=value ...]`: with no arguments, the embedded default on CPU."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy (default: the embedded default on the micro world, CPU)",
                       description="Warm start, RL (Dr. GRPO + self-distillation) and evaluation. "
                                   "Rerunning with the same run_dir resumes from the last checkpoint.")
    p.add_argument("args", nargs="*", metavar="CONFIG.toml | KEY=VALUE",
                   help="an optional TOML config file, then dotted overrides such as rl.steps=4")
    p.add_argument("--extend", action="store_true",
                   help="train a finished run on to a larger rl.steps (its after-RL eval is dropped and made again); "
                        "a run that spent its rl.max_rollouts budget (64 by default) needs a larger one, or 0")
    p.add_argument("--branch-from", metavar="RUN_DIR[:STEP]",
                   help="start this run (give it its own run_dir) at checkpoint STEP of another run (default 0, "
                        "the warm start), on that run's tasks, with this command's overrides")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from carl.config import split_config_args
    from carl.errors import UserError
    from carl.train.loop import train

    config_path, overrides = split_config_args(args.args)
    cfg = _load(config_path, overrides)
    run_dir = Path(cfg.run_dir)
    if args.branch_from:
        from carl.train.state import (INHERITED_SETTINGS, branch_run, branch_task_files, inherited_settings,
                                      is_under, setting_changes, warm_eval_changes)

        source, _, step = args.branch_from.partition(":")
        if not step.isdigit() and step:
            raise UserError(f"--branch-from: got {args.branch_from!r}, expected RUN_DIR or RUN_DIR:STEP (a number)")
        source_dir = Path(source)
        if source_dir.resolve() == run_dir.resolve():
            raise UserError(f"--branch-from: {source!r} is this run's own run_dir; give the branch its own run_dir=...")
        given = {o.split("=", 1)[0].strip() for o in overrides}
        explicit = sorted(k for k in given if is_under(k, INHERITED_SETTINGS))
        if explicit:
            raise UserError(f"--branch-from: {', '.join(explicit)}: a branch starts from {source}'s checkpoint and "
                            f"runs no warm start of its own, so these settings cannot apply to it; drop them, or "
                            f"train a new run (without --branch-from) to get a warm start made with them")
        files = [f"{k}={v}" for k, v in branch_task_files(source_dir).items() if k not in given]
        moot = setting_changes(source_dir, cfg, INHERITED_SETTINGS)  # the task files leave warm_start.* alone
        if moot:  # the config file's (or the defaults') warm start is not the one this branch has
            print(f"--branch-from: the warm start is {source}'s, so this run records the settings that made it, "
                  f"not its config's ({source} -> config): {'; '.join(moot)}")
        cfg = _load(config_path, files + inherited_settings(source_dir) + overrides)
        changes = warm_eval_changes(source_dir, cfg)
        if changes and int(step or 0) == 0:
            print(f"--branch-from: the warm start is evaluated again, as its eval settings differ from "
                  f"{source}'s: {'; '.join(changes)}")
        elif changes:
            print(f"--branch-from: warning: the warm-start eval copied from {source} was made with other eval "
                  f"settings than this run's ({'; '.join(changes)}); RL - warm start compares across them")
        branch_run(source_dir, int(step or 0), run_dir, reevaluate=bool(changes) and int(step or 0) == 0)
    if args.extend:
        from carl.train.state import extend_run

        at = extend_run(run_dir, cfg.rl.steps)
        print(f"{run_dir}: already ran rl.steps={cfg.rl.steps}" if at is None
              else f"{run_dir}: RL goes on from step {at} to {cfg.rl.steps}")
    train(cfg)
    return 0


def _load(config_path, overrides):
    from carl.config import ConfigError, load_config
    from carl.train.config import TrainConfig

    try:
        return load_config(TrainConfig, config_path, overrides)
    except ValueError as e:  # a component's own validation (frozen dataclass __post_init__)
        raise ConfigError(str(e)) from None
