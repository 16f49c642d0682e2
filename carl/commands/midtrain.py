"""`carl midtrain [CONFIG.toml] [a.b=value ...]`: continued pretraining on a team's repositories.

Imports nothing heavy at module level (`carl --help` stays fast).
`python -m carl.commands.midtrain CONFIG.toml [a.b=value ...]` runs it the same way.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("midtrain", help="continued pretraining of a model on your repositories (held-out loss before/after)",
                       description="Collect, filter, deduplicate and pack the files of data.sources, train the model "
                                   "on them (with a share of general data), evaluate held-out files before and after. "
                                   "Rerunning with the same run_dir resumes from the last checkpoint. See docs/midtrain.md.")
    p.add_argument("args", nargs="*", metavar="CONFIG.toml | KEY=VALUE",
                   help="an optional TOML config file, then dotted overrides such as steps=40 data.general.share=0.2")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from carl.config import ConfigError, load_config, split_config_args
    from carl.midtrain.config import MidtrainConfig

    config_path, overrides = split_config_args(args.args)
    try:
        cfg = load_config(MidtrainConfig, config_path, overrides)
    except ValueError as e:  # a component's own validation (frozen dataclass __post_init__)
        raise ConfigError(str(e)) from None
    from carl.midtrain.loop import midtrain

    midtrain(cfg)
    return 0


if __name__ == "__main__":
    import sys

    from carl.config import ConfigError
    from carl.errors import UserError

    parser = argparse.ArgumentParser(prog="carl")
    register(parser.add_subparsers())
    try:
        sys.exit(run(parser.parse_args(["midtrain", *sys.argv[1:]])))
    except (ConfigError, UserError) as e:
        print(f"carl: {'config error: ' if isinstance(e, ConfigError) else ''}{e}", file=sys.stderr)
        sys.exit(2)
