"""`carl serve` and `carl online`: the production agent as a service, and the cycle that retrains it.

    carl serve --add-user alice --users-file users.txt [--admin]      prints alice's token once
    carl serve --checkpoint runs/default --workspaces ws/ --state-dir state/ --users-file users.txt \
               [--store-url sqlite:///state/feedback.db] [--weights-dir weights/] [--port 8400]
    carl online online.toml [a.b=value ...]                             the scheduled cycle

`carl serve` runs the checkpoint as it ran in its training run's eval (same engine, chat
rendering, sampling, limits and tools: carl.train.checkpoint_policy); with `--weights-dir` it
accepts hot weight swaps from `carl online` (POST /v1/admin/deploy). See docs/online.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from carl.errors import UserError
from carl.sandbox.base import HOST_BACKENDS


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser("serve", help="serve the agent over HTTP to a team's users")
    serve.add_argument("--add-user", metavar="NAME", help="add a user to --users-file, print their token, exit")
    serve.add_argument("--admin", action="store_true", help="with --add-user: the user may deploy weights")
    serve.add_argument("--users-file", required=True, help="users and token hashes (NAME SHA256 [admin] per line)")
    serve.add_argument("--checkpoint", help="the model: a carl run dir, RUN:STEP, a checkpoint or a model folder")
    serve.add_argument("--workspaces", help="root of the users' workspaces: <root>/<user>/<workspace>")
    serve.add_argument("--state-dir", help="where session working copies (and deploy records) live")
    serve.add_argument("--store-url", help="feedback store URL (default: sqlite:///<state-dir>/feedback.db; "
                       "postgresql+psycopg://user:pw@host/db for a deployment)")
    serve.add_argument("--weights-dir", help="the weights directory `carl online` publishes to (hot swaps)")
    serve.add_argument("--sandbox", default="bwrap", choices=list(HOST_BACKENDS),
                       help="sandbox backend of the agent's episodes (local isolates nothing)")
    serve.add_argument("--temperature", type=float, help="sampling temperature (default: the run's eval temperature)")
    serve.add_argument("--max-concurrent", type=int, default=8, help="requests running at once (429 beyond)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8400)
    serve.set_defaults(func=cmd_serve)

    online = subparsers.add_parser("online", help="retrain the served model from production feedback, on a cadence")
    online.add_argument("config", help="TOML config (carl.online.cycle.OnlineConfig)")
    online.add_argument("overrides", nargs="*", help="a.b=value overrides")
    online.set_defaults(func=cmd_online)


def cmd_serve(args: argparse.Namespace) -> int:
    from carl.online.auth import add_user

    if args.add_user:
        try:
            token = add_user(args.users_file, args.add_user, admin=args.admin)
        except ValueError as e:
            raise UserError(f"--add-user: {e}") from None
        print(f"added {args.add_user}{' (admin)' if args.admin else ''} to {args.users_file}; their token "
              f"(shown once, keep it secret):\n{token}")
        return 0
    for flag in ("checkpoint", "workspaces", "state_dir"):
        if not getattr(args, flag):
            raise UserError(f"serve: --{flag.replace('_', '-')} is required (or --add-user NAME)")
    service = build_service(args)
    from carl.online.service import serve

    print(f"carl serve: model version {service.model_version} on http://{args.host}:{args.port} "
          f"({len(service.users.users)} users, store {service.config.store.url})")
    try:
        serve(service, host=args.host, port=args.port)
    finally:
        service.close()
    return 0


def build_service(args: argparse.Namespace):
    from pathlib import Path

    from carl.harness.tools import default_tools
    from carl.online.service import ServeConfig, Service
    from carl.online.store import StoreConfig
    from carl.sandbox.base import SandboxConfig
    from carl.train.checkpoint_policy import load_checkpoint_policy

    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    if args.max_concurrent <= 0:
        raise UserError(f"--max-concurrent: got {args.max_concurrent}, expected a positive integer")
    engine, limits, info = load_checkpoint_policy(args.checkpoint, temperature=args.temperature,
                                                  weights_dir=args.weights_dir)
    run_sandbox = info.get("sandbox") or SandboxConfig()
    try:
        config = ServeConfig(
            workspaces=args.workspaces, state_dir=str(state), users_file=args.users_file,
            store=StoreConfig(url=args.store_url or f"sqlite:///{(state / 'feedback.db').resolve()}"),
            sandbox=SandboxConfig(**{**run_sandbox.__dict__, "backend": args.sandbox}),
            limits=limits, max_concurrent_requests=args.max_concurrent)
        tools = default_tools()
        if info.get("tools"):
            tools = {n: t for n, t in tools.items() if n in info["tools"]}
        return Service(config, engine, tools=tools)
    except ValueError as e:
        raise UserError(f"serve: {e}") from None


def cmd_online(args: argparse.Namespace) -> int:
    from carl.config import load_config
    from carl.online.cycle import OnlineConfig, OnlineLoop

    cfg = load_config(OnlineConfig, args.config, args.overrides)
    loop = OnlineLoop(cfg)
    try:
        loop.run()
    finally:
        loop.close()
    return 0
