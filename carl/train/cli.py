"""`carl train [CONFIG.toml] [a.b=value ...]`: with no arguments, the embedded default on CPU."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy (default: the embedded default on the micro world, CPU)",
                       description="Warm start, RL (Dr. GRPO + self-distillation) and evaluation. "
                                   "Rerunning with the same run_dir resumes from the last checkpoint.")
    p.add_argument("args", nargs="*", metavar="CONFIG.toml | KEY=VALUE",
                   help="an optional TOML config file, then dotted overrides such as rl.steps=4")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from carl.config import load_config
    from carl.errors import UserError
    from carl.train.config import TrainConfig
    from carl.train.loop import train

    config_path = None
    overrides = list(args.args)
    if overrides and "=" not in overrides[0]:
        config_path = overrides.pop(0)
        if not Path(config_path).is_file():
            raise UserError(f"config file {config_path!r} does not exist (expected a TOML file or KEY=VALUE overrides)")
    try:
        cfg = load_config(TrainConfig, config_path, overrides)
    except ValueError as e:  # a component's own validation (frozen dataclass __post_init__)
        from carl.config import ConfigError

        raise ConfigError(str(e)) from None
    train(cfg)
    return 0
