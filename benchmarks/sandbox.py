"""Sandbox costs, measured in one run (issue 2, "Evidence").

    .venv/bin/python benchmarks/sandbox.py [--iterations 50] [--files 20] [--command true]

Part 1: p50/p99 of create + first exec + close, per backend (local, bwrap, remote = bwrap
behind an in-process `carl env serve`), against a bare `subprocess.run` of the same command,
as a ratio. Also the workspace copy alone, `cp -a` against shutil.copytree, since the copy is
the main cost of creating a sandbox.
Part 2: 8 read_file calls in one message (the harness runs them in parallel) against one call,
through carl.harness.execute.run_calls, on a bwrap and a remote sandbox.
Part 3: 8 sandboxed test runs (create, `python -m pytest` on a small CPU-bound suite, close)
at once against the same 8 one after another, per backend: the speed-up the machine's cores
allow (at most 2x on 2 cores) minus what the sandboxes cost in contention.
Target on a 2-core machine: bwrap create+exec+close p50 < 50 ms; 8 parallel reads < 2x one read;
8 concurrent test runs at least 1.7x faster than sequential.

The "cpu ms" column is CPU time per iteration of this process and the children it waited for: it
is steadier than wall time on a shared machine, but it misses what runs inside bwrap's PID
namespace (reaped there), and with the in-process server it includes the server's work.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from carl.sandbox import SandboxConfig, open_sandbox
from carl.sandbox.bwrap import bwrap_available

COMMANDS = {"true": ["true"], "python": [sys.executable, "-c", "pass"]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--files", type=int, default=20, help="files in the generated repository")
    parser.add_argument("--command", choices=sorted(COMMANDS), default="true")
    parser.add_argument("--runs", type=int, default=8, help="test runs at once in part 3")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run (comma list)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    warnings.simplefilter("ignore")  # the local backend's "isolates nothing" warning

    with tempfile.TemporaryDirectory(prefix="carl-bench-") as tmp:
        repo = make_repo(Path(tmp) / "repo", args.files)
        argv = COMMANDS[args.command]
        print(f"repository: {args.files} files, {du_kb(repo)} KiB; command: {' '.join(argv)}; "
              f"{args.iterations} iterations")  # fmt: skip
        server = start_server() if bwrap_available() else None
        try:
            if "1" in parts:
                print_copy_costs(repo, Path(tmp), args.iterations)
                print_lifecycle_costs(repo, argv, args.iterations, server)
            if "2" in parts:
                print_parallel_reads(repo, args.iterations, server)
            if "3" in parts:
                print_concurrent_test_runs(make_test_repo(Path(tmp) / "suite"), args.runs, server)
        finally:
            if server:
                server.should_exit = True


def print_lifecycle_costs(repo: Path, argv: list[str], n: int, server) -> None:
    bare = timings(lambda: subprocess.run(argv, check=False, capture_output=True), n)
    print("\ncreate + first exec + close        p50 ms   p99 ms  p50/bare  cpu ms")
    row("bare subprocess.run", bare, bare)
    venv = sys.prefix  # as the harness does: this venv bound read-only (its python is the command's)
    configs = {"local": SandboxConfig(backend="local", python_env=venv)}
    if bwrap_available():
        configs["bwrap"] = SandboxConfig(backend="bwrap", python_env=venv)
        if Path("/dev/shm").is_dir():
            configs["bwrap, scratch_dir=/dev/shm"] = SandboxConfig(
                backend="bwrap", python_env=venv, scratch_dir="/dev/shm"
            )
    if gvisor_available():
        configs["gvisor"] = SandboxConfig(backend="gvisor", python_env=venv)
    if server:
        configs["remote (bwrap, upload)"] = remote_config(server, python_env=venv)
    for name, config in configs.items():

        def cycle(config=config):
            with open_sandbox(repo, config) as sb:
                res = sb.exec(argv)
            if res.exit_code != 0:
                raise SystemExit(f"{' '.join(argv)} failed in the sandbox: {res.output}")

        row(name, timings(cycle, n), bare)
        if name in ("local", "bwrap", "gvisor"):
            with open_sandbox(repo, config) as sb:
                row(f"  {name}: exec alone", timings(lambda sb=sb: sb.exec(argv), n), bare)


def print_copy_costs(repo: Path, tmp: Path, n: int) -> None:
    print("\nworkspace copy                     p50 ms   p99 ms            cpu ms")
    for name, copy in {
        "cp -a --reflink=auto": lambda dst: subprocess.run(
            ["cp", "-a", "--reflink=auto", "-T", repo, dst], check=True
        ),
        "shutil.copytree": lambda dst: shutil.copytree(repo, dst, symlinks=True),
    }.items():
        dst = tmp / "copy"

        def once(copy=copy, dst=dst):
            copy(dst)
            shutil.rmtree(dst)

        row(name, timings(once, n))


def print_parallel_reads(repo: Path, n: int, server) -> None:
    try:
        from carl.harness.execute import run_calls
        from carl.harness.tools.files import ReadFile
        from carl.types import ToolCall
    except ImportError as e:
        print(f"\n8 parallel read_file calls: skipped (harness not importable: {e})")
        return
    tools = {"read_file": ReadFile()}
    paths = [f"pkg/mod{i}.py" for i in range(8)]
    one = [ToolCall("read_file", {"path": paths[0]}, 0)]
    eight = [ToolCall("read_file", {"path": p}, i) for i, p in enumerate(paths)]
    configs = (
        {"bwrap": SandboxConfig(backend="bwrap")} if bwrap_available() else {"local": SandboxConfig("local")}
    )
    if server:
        configs["remote"] = remote_config(server)
    print("\nread_file calls in one message     p50 ms   p99 ms  8 vs 1    cpu ms")
    for name, config in configs.items():
        with open_sandbox(repo, config) as sb:
            t1 = timings(lambda sb=sb: run_calls(one, tools, sb), n)
            t8 = timings(lambda sb=sb: run_calls(eight, tools, sb), n)
        row(f"{name}: 1 call", t1)
        row(f"{name}: 8 calls", t8, t1)


def print_concurrent_test_runs(repo: Path, runs: int, server) -> None:
    venv = sys.prefix
    configs = {"local": SandboxConfig(backend="local", python_env=venv)}
    if bwrap_available():
        configs["bwrap"] = SandboxConfig(backend="bwrap", python_env=venv)
    if gvisor_available():
        configs["gvisor"] = SandboxConfig(backend="gvisor", python_env=venv)
    if server:
        configs["remote (bwrap)"] = remote_config(server, python_env=venv)

    def one_run(config: SandboxConfig) -> None:
        with open_sandbox(repo, config) as sb:
            res = sb.exec(["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], timeout_s=300)
        if res.exit_code != 0:
            raise SystemExit(f"the test run failed in the sandbox: {res.output[-2000:]}")

    print(f"\n{runs} test runs (create + pytest + close)  sequential s  concurrent s  speed-up")
    for name, config in configs.items():
        one_run(config)  # warm-up: imports, page cache
        start = time.perf_counter()
        for _ in range(runs):
            one_run(config)
        sequential_s = time.perf_counter() - start
        threads = [threading.Thread(target=one_run, args=(config,)) for _ in range(runs)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent_s = time.perf_counter() - start
        print(f"{name:<38}{sequential_s:9.2f}  {concurrent_s:12.2f}  {sequential_s / concurrent_s:7.2f}x")


# -- helpers ---------------------------------------------------------------------------------------


def make_test_repo(root: Path) -> Path:
    """A package with a CPU-bound test suite of about a second (so that cores, not start-up, decide)."""
    (root / "tests").mkdir(parents=True)
    (root / "work.py").write_text("def spin(n):\n    return sum(i * i for i in range(n))\n")
    body = "".join(f"def test_{i}():\n    assert spin(300_000) > 0\n\n\n" for i in range(12))
    (root / "tests" / "test_work.py").write_text(f"from work import spin\n\n\n{body}")
    return root


def gvisor_available() -> bool:
    import os

    return shutil.which("runsc") is not None and os.geteuid() == 0




def make_repo(root: Path, num_files: int) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    for i in range(num_files):
        folder = "pkg" if i % 2 == 0 or i < 16 else "tests"
        body = "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n\n" for j in range(40))
        (root / folder / f"mod{i}.py").write_text(f'"""Module {i}."""\n\n{body}')
    return root


def du_kb(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) // 1024


@dataclass
class Timing:
    walls_s: list[float]
    """Wall time of each iteration, sorted."""
    cpu_s: float
    """CPU time per iteration, this process and its waited-for children (less noisy under load)."""

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.walls_s) * 1000


def timings(fn: Callable[[], object], n: int) -> Timing:
    fn()  # warm-up
    walls = []
    cpu_start = cpu_time()
    for _ in range(n):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return Timing(sorted(walls), (cpu_time() - cpu_start) / n)


def cpu_time() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def row(name: str, t: Timing, base: Timing | None = None) -> None:
    p99 = t.walls_s[min(len(t.walls_s) - 1, int(len(t.walls_s) * 0.99))] * 1000
    ratio = f"{t.p50_ms / base.p50_ms:8.1f}x" if base else " " * 9
    print(f"{name:<34}{t.p50_ms:7.1f}  {p99:7.1f}  {ratio}  {t.cpu_s * 1000:7.1f}")


TOKEN = "bench-token"


def start_server():
    import uvicorn

    from carl.sandbox.server import ServerConfig, create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(ServerConfig(token=TOKEN, sandbox=SandboxConfig(backend="bwrap")))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    server.url = f"http://127.0.0.1:{port}"
    return server


def remote_config(server, **kw) -> SandboxConfig:
    return SandboxConfig(backend="remote", server_url=server.url, server_token=TOKEN, **kw)


if __name__ == "__main__":
    main()
