"""The `carl` command. Each command group is a module of carl/commands that defines
`register(subparsers)`; those modules import nothing heavy at module level, so `carl --help`
stays fast and torch is only imported by the commands that train.

    carl demo                  the main job on the embedded default
    carl sandbox run ...       one command in a fresh sandbox
    carl env serve ...         the HTTP environment server
    carl agent run ...         one agent episode, transcript shown live
    carl tasks build|validate|stats|show ...
    carl train [CONFIG] [a.b=value ...]
    carl eval --checkpoint DIR --tasks FILE
    carl bench build|run|grade|report|compare|export   pinned suites of real-repository tasks, any
                               agent scored on them by the RL reward (HTML reports, paired comparisons)
    carl engine setup|serve    vLLM's environment, a vLLM server for carl
    carl serve ...             the agent as an HTTP service for a team (sessions, feedback store)
    carl online CONFIG         retrain the served model from production feedback, gate, deploy
    carl midtrain [CONFIG] [a.b=value ...]   continued pretraining on a team's repositories
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# command group -> module that registers it. Modules missing from a partial install are skipped.
GROUPS = {
    "demo": "carl.commands.demo",
    "sandbox": "carl.commands.sandbox",
    "env": "carl.commands.env",
    "agent": "carl.commands.agent",
    "tasks": "carl.commands.tasks",
    "train": "carl.commands.train",
    "eval": "carl.commands.eval",
    "bench": "carl.commands.bench",
    "engine": "carl.commands.engine",
    "serve/online": "carl.commands.online",  # registers both commands
    "midtrain": "carl.commands.midtrain",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="carl", description="Coding Agent Reinforcement Learning")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in GROUPS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    code = run_command(args)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) > 0:
        from carl.train.ranks import exit_follower

        exit_follower(code)  # a torchrun follower rank: no interpreter teardown (see there why)
    return code


def run_command(args: argparse.Namespace) -> int:
    """The command's exit code; a user's mistake is a line on stderr, not a traceback."""
    from carl.config import ConfigError
    from carl.engine.base import EngineError
    from carl.errors import UserError

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"carl: config error: {e}", file=sys.stderr)
        return 2
    except UserError as e:
        print(f"carl: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        print(f"carl: engine: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("carl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `carl tasks show ... | head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # an OSError, or a library's own error for it (safetensors' SafetensorError)
        from carl.errors import is_disk_full

        if not is_disk_full(e):
            raise
        print(f"carl: {disk_full_message(e)}", file=sys.stderr)
        return 1


def disk_full_message(e: BaseException) -> str:
    """A full disk (or quota) in any command, in a sentence: where, how much is free, what to do.
    Nothing carl keeps is left half-written by it (atomic writes; a torn JSONL line is dropped on
    read), and runs resume from their last complete checkpoint."""
    import os
    import shutil

    name = getattr(e, "filename", None)
    name = name if isinstance(name, str) else ""
    where = os.path.dirname(os.path.abspath(name)) if name else os.getcwd()
    while not os.path.isdir(where):  # the file's folder may not exist yet; "/" always does
        where = os.path.dirname(where)
    try:
        free = f"{shutil.disk_usage(where).free / 1e9:.1f} GB free now"
    except OSError:
        free = "free space unknown"
    what = f"writing {name}" if name else f"under {where}"
    return (f"no space left on the device ({what}; {free}): free some space and run the same command "
            "again; files carl writes are replaced whole or not at all, and a run resumes from its last "
            "complete checkpoint")

if __name__ == "__main__":
    sys.exit(main())
