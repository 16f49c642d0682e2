"""`carl env serve`: the HTTP environment server (see carl.sandbox.server).

    carl env serve --host 127.0.0.1 --port N [--token T | $CARL_ENV_TOKEN] [--max-sandboxes N] [--ttl-s N]

The server runs arbitrary code for whoever holds the token, so it does not start without one.
"""

from __future__ import annotations
from carl.sandbox.base import HOST_BACKENDS


def register(subparsers) -> None:
    group = subparsers.add_parser("env", help="the environment server for remote rollout workers")
    sub = group.add_subparsers(dest="env_command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="host sandboxes over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--token", help="bearer token clients must send (default: $CARL_ENV_TOKEN)")
    serve.add_argument("--max-sandboxes", type=int, default=64, help="most sandboxes open at once")
    serve.add_argument("--ttl-s", type=float, default=300.0, help="close sandboxes silent for this long")
    serve.add_argument("--backend", default="bwrap", choices=list(HOST_BACKENDS))
    serve.add_argument("--python-env", metavar="DIR", help="default virtual environment for sandboxes")
    serve.add_argument("--scratch-dir", metavar="DIR", help="where workspace copies live (e.g. /dev/shm)")
    serve.set_defaults(func=serve_command)


def serve_command(args) -> int:
    import os

    from carl.errors import UserError
    from carl.sandbox.base import SandboxConfig
    from carl.sandbox.server import ServerConfig, serve

    token = args.token or os.environ.get("CARL_ENV_TOKEN")
    if not token:
        raise UserError(
            "env serve: no token; the server runs arbitrary code, so pass --token T or set $CARL_ENV_TOKEN "
            "(e.g. export CARL_ENV_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))'))"
        )
    try:
        config = ServerConfig(
            token=token,
            max_sandboxes=args.max_sandboxes,
            ttl_s=args.ttl_s,
            sandbox=SandboxConfig(
                backend=args.backend, python_env=args.python_env, scratch_dir=args.scratch_dir
            ),
        )
    except ValueError as e:
        raise UserError(f"env serve: {e}") from e
    serve(config, host=args.host, port=args.port)
    return 0
