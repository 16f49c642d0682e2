"""`carl sandbox run`: one command in a fresh sandbox over a copy of a directory (for debugging).

    carl sandbox run --backend bwrap --workspace DIR [--timeout-s N] [--python-env DIR] -- COMMAND...

Several words after `--` run as an argv; a single word runs under `bash -c` (so pipes work:
`-- 'pytest -q | tail -3'`). The command's stdout and stderr are printed as they were, then its
exit code; `carl` exits with that code. The copy is deleted afterwards; DIR is never modified.
"""

from __future__ import annotations

import argparse
import sys
from carl.sandbox.base import BACKENDS


def register(subparsers) -> None:
    group = subparsers.add_parser("sandbox", help="run commands in a fresh sandbox")
    sub = group.add_subparsers(dest="sandbox_command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run one command in a fresh sandbox over a copy of DIR")
    run.add_argument("--backend", default="bwrap", choices=list(BACKENDS))
    run.add_argument("--workspace", required=True, metavar="DIR", help="directory to copy into the sandbox")
    run.add_argument("--timeout-s", type=float, default=60.0, help="wall-clock limit (default 60)")
    run.add_argument(
        "--python-env", metavar="DIR", help="virtual environment bound read-only, bin/ first on PATH"
    )
    run.add_argument(
        "--ro-bind", action="append", default=[], metavar="PATH", help="extra read-only host path"
    )
    run.add_argument("--network", action="store_true", help="allow network access (default: none)")
    run.add_argument("--server-url", help="remote backend: URL of `carl env serve` (token: $CARL_ENV_TOKEN)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    run.set_defaults(func=run_command)


def run_command(args) -> int:
    from pathlib import Path

    from carl.errors import UserError
    from carl.sandbox import SandboxConfig, SandboxError, open_sandbox

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UserError("sandbox run: no command given; expected `-- COMMAND...` at the end")
    if not Path(args.workspace).is_dir():
        raise UserError(f"sandbox run: --workspace {args.workspace!r} is not a directory")
    try:
        config = SandboxConfig(
            backend=args.backend,
            timeout_s=args.timeout_s,
            python_env=args.python_env,
            ro_binds=tuple(args.ro_bind),
            network=args.network,
            server_url=args.server_url,
        )
    except ValueError as e:
        raise UserError(f"sandbox run: {e}") from e
    try:
        with open_sandbox(args.workspace, config) as sandbox:
            res = sandbox.exec(command[0] if len(command) == 1 else command)
    except SandboxError as e:
        raise UserError(f"sandbox run: the sandbox failed: {e}") from e
    sys.stdout.write(res.stdout)
    sys.stdout.flush()
    sys.stderr.write(res.stderr)
    status = f"timed out after {args.timeout_s:.1f} s" if res.timed_out else f"exit code {res.exit_code}"
    print(f"[carl sandbox: {status}, {res.duration_s:.3f} s]", file=sys.stderr)
    return res.exit_code if 0 <= res.exit_code < 256 else 128 + abs(res.exit_code) % 128
