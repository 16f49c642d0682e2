"""Load on `carl env serve` (bwrap backend), then a check that the host is left clean.

    python benchmarks/env_server_load.py [--clients 8] [--kill 2] [--seconds 30]

    this script (parent)                       carl env serve (subprocess, bwrap, own $TMPDIR)
      |-- client 0..N-1 (subprocesses) -------->  open (tar.gz upload), write, read, list,
      |     each: open sandbox, mixed calls,      exec, exec that times out, exec that leaves
      |     close; repeat until --seconds         background processes, read of a missing file
      |-- SIGKILL --kill clients while their --> their sandboxes: reaped after --ttl-s
      |   `sleep 30` exec is in flight
      |-- leak check (server still up, after the TTL)
      |-- open 3 sandboxes, start background processes and an exec, then kill -9 the server
      |-- leak check "after kill -9"        (what the killed server left)
      |-- restart the server on the same $TMPDIR
      |-- leak check "after restart"        (before any sandbox is opened)
      |-- open + close one sandbox
      |-- leak check "after first sandbox"
      |-- SIGTERM the server; final leak check

Leak items: sandbox processes (every sandbox of this run gets a marker variable; a process with
it in /proc/PID/environ is one, whatever its uid, and its uid is shown: 2,000,000-2,999,999 is
the sandbox range), bwrap processes of this run (the marker is on their command line), uid lock
files ($TMPDIR/carl-sandbox-uids), scratch copies (carl-bwrap-*), upload staging dirs
(carl-upload-*), and the sandboxes' cgroups (named after the scratch copies, where the host
makes them). The server runs with a $TMPDIR of its own, so the sandboxes of other users of the
machine neither count nor get touched. Whatever this run leaks is killed and removed at the end.

Prints: calls done, errors by kind, p50/p99 latency per call type, and PASS/FAIL per leak item.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from carl.sandbox import cgroup
from carl.sandbox.scratch import sweep_stale

UID_RANGE = range(2_000_000, 3_000_000)
MARKER = "CARL_LOAD_RUN"
"""Every sandbox of this run has this variable set to the run's id (found in /proc/*/environ)."""
LONG_EXEC = "sleep 30"
"""What a client to be killed runs when the parent kills it."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=8, help="concurrent client processes")
    p.add_argument("--kill", type=int, default=2, help="clients SIGKILLed while a call is in flight")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the clients make calls")
    p.add_argument(
        "--ttl-s", type=float, default=8.0, help="the server's ttl_s (reaps killed clients' sandboxes)"
    )
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)  # internal: run as client N
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--repo", help=argparse.SUPPRESS)
    p.add_argument("--victim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client is not None:
        run_client(args)
        return
    if not 0 <= args.kill <= args.clients:
        p.error(f"--kill: got {args.kill}, expected 0 to --clients ({args.clients})")

    run_id = secrets.token_hex(6)
    tmp = Path(tempfile.mkdtemp(prefix="env-load-"))
    repo = make_repo(tmp / "repo")
    server_tmp = tmp / "server-tmp"  # the server's $TMPDIR: its scratch copies, uid locks, uploads
    server_tmp.mkdir(mode=0o700)
    token = secrets.token_hex(16)
    env = {**os.environ, "CARL_ENV_TOKEN": token}
    server = Server({**env, "TMPDIR": str(server_tmp)}, tmp / "server.log", args.ttl_s)
    checks: list[tuple[str, dict[str, list[str]]]] = []

    def check(title: str, must_be_clean: bool = True) -> None:
        checks.append((title, leaks(server_tmp, run_id, server.pids), must_be_clean))

    try:
        server.start()
        print(f"server on {server.url} (pid {server.proc.pid}), {args.clients} clients for {args.seconds:.0f} s, "
              f"{args.kill} killed mid-call", flush=True)  # fmt: skip
        t0 = time.monotonic()
        records = run_load(args, server.url, repo, env, run_id)
        load_s = time.monotonic() - t0
        t0 = time.monotonic()  # the killed clients' sandboxes go when the reaper finds them past ttl_s
        while time.monotonic() - t0 < args.ttl_s + 20 and any(
            leaks(server_tmp, run_id, server.pids).values()
        ):
            time.sleep(0.5)
        check(f"after the load, server up ({time.monotonic() - t0:.1f} s after the last call)")

        kill9_server(server, repo, run_id)
        check("after kill -9 of the server (what it left: not a failure, the restart must clean it)", False)
        server.start()
        time.sleep(1.0)
        check("after restart, no sandbox opened yet")
        with open_remote(server.url, repo, run_id, token) as sb:
            sb.exec("true")
        check("after restart + one sandbox opened and closed")
        server.stop()
        check("after SIGTERM of the restarted server")
        tracebacks = server.log.read_text().count("Traceback")
    finally:
        server.kill()
        left = kill_ours(run_id)
        time.sleep(0.5)
        sweep_stale("carl-bwrap-", server_tmp, cgroup.remove_stale)  # unmounts quotas, removes cgroups
        shutil.rmtree(tmp, ignore_errors=True)
    report(records, load_s, checks, tracebacks, left)


# ---- the server --------------------------------------------------------------------------------


class Server:
    """`carl env serve --backend bwrap` on a free loopback port, logging to a file."""

    def __init__(self, env: dict[str, str], log: Path, ttl_s: float):
        self.env, self.log, self.ttl_s = env, log, ttl_s
        self.proc: subprocess.Popen | None = None
        self.pids: list[int] = []  # of every start: scratch copies and cgroups are named after them
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import httpx

        argv = [sys.executable, "-m", "carl", "env", "serve", "--backend", "bwrap", "--port", str(self.port),
                "--ttl-s", str(self.ttl_s), "--max-sandboxes", "64"]  # fmt: skip
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.pids.append(self.proc.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}; see {self.log}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not answer /v1/health within 60 s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # uvicorn shuts down: the lifespan closes every sandbox
        self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def kill9_server(server: Server, repo: Path, run_id: str) -> None:
    """Open sandboxes with background processes and an exec in flight, then SIGKILL the server."""
    token = server.env["CARL_ENV_TOKEN"]
    boxes = [open_remote(server.url, repo, run_id, token) for _ in range(3)]
    for sb in boxes:
        sb.exec("(sleep 300 &); setsid sleep 300 & nohup sleep 300 >/dev/null 2>&1 & echo started")
        sb.write_file("big.bin", os.urandom(1 << 20))
    threading.Thread(target=lambda: _quietly(boxes[0].exec, LONG_EXEC, timeout_s=60), daemon=True).start()
    time.sleep(1.0)  # the exec is running inside the sandbox now
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    time.sleep(1.0)  # let --die-with-parent and the PID namespaces take their processes down
    for sb in boxes:
        sb._stop.set()  # no heartbeats to a dead server; close() below fails quietly
        sb.close()


def _quietly(fn, *a, **kw) -> None:
    try:
        fn(*a, **kw)
    except Exception:
        pass


# ---- the clients -------------------------------------------------------------------------------


def run_load(args, url: str, repo: Path, env: dict[str, str], run_id: str) -> list[dict]:
    """Start the clients, SIGKILL the victims once their long exec is in flight, collect records."""
    records: list[dict] = []
    lock = threading.Lock()
    procs = []
    for i in range(args.clients):
        victim = i < args.kill
        argv = [sys.executable, __file__, "--client", str(i), "--url", url, "--repo", str(repo),
                "--seconds", str(args.seconds), "--run-id", run_id] + (["--victim"] if victim else [])  # fmt: skip
        procs.append((subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True), victim))

    def read(proc: subprocess.Popen, victim: bool) -> None:
        for line in proc.stdout:
            rec = json.loads(line)
            if rec.get("event") == "in_flight" and victim:
                time.sleep(0.5)  # the request has reached the server and runs in the sandbox
                proc.send_signal(signal.SIGKILL)
                with lock:
                    records.append({"op": "killed mid-call", "ms": 0.0, "error": None})
                continue
            with lock:
                records.append(rec)

    readers = [threading.Thread(target=read, args=pv) for pv in procs]
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=args.seconds + 120)
    for proc, _ in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return records


def run_client(args) -> None:
    """One client: sandboxes opened and closed in a loop, each with a random mix of calls."""
    rng = random.Random(args.client)
    deadline = time.monotonic() + args.seconds
    sessions = 0
    while time.monotonic() < deadline:
        sessions += 1
        sb = timed("open", lambda: open_remote(args.url, Path(args.repo), args.run_id))
        if sb is None:
            time.sleep(0.5)
            continue
        with sb:
            for n in range(rng.randint(4, 10)):
                name = f"f{n}.bin"
                data = os.urandom(rng.randint(1, 64 << 10))
                timed("write", lambda: sb.write_file(name, data))
                op = rng.choice(
                    ["read", "list", "exec", "exec", "exec_timeout", "exec_background", "read_missing"]
                )
                if op == "read":
                    timed("read", lambda: sb.read_file(name))
                elif op == "list":
                    timed("list", lambda: sb.list_files(".", recursive=True))
                elif op == "exec":
                    timed("exec", lambda: sb.exec("echo ok; ls | wc -l"))
                elif op == "exec_timeout":
                    timed("exec_timeout", lambda: sb.exec("sleep 10", timeout_s=0.5))
                elif op == "exec_background":
                    timed("exec_background", lambda: sb.exec("(sleep 300 &); setsid sleep 300 & echo bg"))
                else:
                    timed("read_missing", lambda: sb.read_file("no/such/file"))
            if args.victim and sessions >= 2:
                print(json.dumps({"event": "in_flight"}), flush=True)
                sb.exec(LONG_EXEC, timeout_s=60)  # SIGKILLed by the parent while this runs
            timed("close", sb.close)


def timed(op: str, fn):
    """Run one call and print its record: {"op", "ms", "error": kind or None}."""
    from carl.sandbox import SandboxError, SandboxPathError

    t = time.perf_counter()
    out, error = None, None
    try:
        out = fn()
    except SandboxPathError:
        error = "path"
    except SandboxError as e:  # "environment server: HTTP 429 (capacity): ..." or a transport error
        msg = str(e)
        error = msg.split("(", 1)[1].split(")", 1)[0] if "HTTP " in msg else f"other: {msg[:80]}"
    print(json.dumps({"op": op, "ms": (time.perf_counter() - t) * 1e3, "error": error}), flush=True)
    return out


def open_remote(url: str, repo: Path, run_id: str, token: str | None = None):
    from carl.sandbox import SandboxConfig, open_sandbox

    config = SandboxConfig(backend="remote", server_url=url, server_token=token, timeout_s=20.0,
                           env={MARKER: run_id})  # fmt: skip
    return open_sandbox(repo, config)


def make_repo(path: Path) -> Path:
    (path / "pkg").mkdir(parents=True)
    (path / "pkg" / "__init__.py").write_text("VALUE = 41\n")
    (path / "tests").mkdir()
    (path / "tests" / "test_value.py").write_text(
        "from pkg import VALUE\n\ndef test_value():\n    assert VALUE == 41\n"
    )
    for i in range(20):
        (path / "pkg" / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    return path


# ---- the leak check ----------------------------------------------------------------------------


def leaks(server_tmp: Path, run_id: str, server_pids: list[int]) -> dict[str, list[str]]:
    """Item -> what is left of it (empty: clean)."""
    sandbox_procs, bwrap_procs = [], []
    for pid, uid, comm, cmdline, environ in _processes():
        if f"{MARKER}={run_id}".encode() in environ:
            sandbox_procs.append(
                f"{pid} {comm} uid {uid}" + ("" if uid in UID_RANGE else " (not a sandbox uid)")
            )
        elif comm == "bwrap" and run_id.encode() in cmdline:
            bwrap_procs.append(f"{pid} bwrap")
    lock_dir = server_tmp / "carl-sandbox-uids"
    names = tuple(f"carl-bwrap-{pid}-" for pid in server_pids)
    return {
        "sandbox processes": sandbox_procs,
        "bwrap processes": bwrap_procs,
        "uid lock files": sorted(p.name for p in lock_dir.iterdir()) if lock_dir.is_dir() else [],
        "scratch copies (carl-bwrap-*)": sorted(p.name for p in server_tmp.glob("carl-bwrap-*")),
        "upload staging (carl-upload-*)": sorted(p.name for p in server_tmp.glob("carl-upload-*")),
        "cgroups": _cgroups(names),
    }


def _processes():
    """(pid, real uid, comm, cmdline, environ) of every process we can read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        base = Path("/proc", entry)
        try:
            status = (base / "status").read_text()
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            yield (int(entry), uid, (base / "comm").read_text().strip(), (base / "cmdline").read_bytes(),
                   (base / "environ").read_bytes())  # fmt: skip
        except (OSError, StopIteration, ValueError):
            continue  # exited meanwhile, or a kernel thread


def _cgroups(names: tuple[str, ...]) -> list[str]:
    """cgroup directories anywhere under /sys/fs/cgroup named after one of the servers' scratch copies."""
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        ours = [d for d in dirnames if d.startswith(names)]
        found += [os.path.join(dirpath, d).removeprefix("/sys/fs/cgroup/") for d in ours]
        dirnames[:] = [d for d in dirnames if d not in ours and not d.startswith("carl-")]
    return found


def kill_ours(run_id: str) -> int:
    """SIGKILL every process this run left (after the report's checks); returns how many."""
    n = 0
    for pid, _, comm, cmdline, environ in _processes():
        if f"{MARKER}={run_id}".encode() in environ or (comm == "bwrap" and run_id.encode() in cmdline):
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


# ---- the report --------------------------------------------------------------------------------


def report(records: list[dict], load_s: float, checks, tracebacks: int, killed_after: int) -> None:
    by_op: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        by_op[r["op"]].append(r["ms"])
        if r["error"]:
            errors[r["op"]][r["error"]] += 1
    calls = sum(len(v) for op, v in by_op.items() if op != "killed mid-call")
    print(f"\n{calls} calls in {load_s:.1f} s ({calls / load_s:.1f}/s), "
          f"{len(by_op.get('killed mid-call', []))} clients killed mid-call\n")  # fmt: skip
    print(f"{'call':<18}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}  errors by kind")
    for op in [
        "open",
        "write",
        "read",
        "list",
        "exec",
        "exec_timeout",
        "exec_background",
        "read_missing",
        "close",
    ]:
        ms = sorted(by_op.get(op, []))
        if not ms:
            continue
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        errs = ", ".join(f"{k}: {v}" for k, v in errors[op].most_common()) or "-"
        expected = "  (expected: the file does not exist)" if op == "read_missing" else ""
        print(f"{op:<18}{len(ms):>6}{p50:>10.1f}{p99:>10.1f}  {errs}{expected}")
    print(f"\nserver tracebacks in its log: {tracebacks}")
    print("\nleak check (PASS: nothing left)")
    for title, items, must_be_clean in checks:
        print(f"  {title}")
        for item, left in items.items():
            shown = f"({len(left)} left: {', '.join(left[:3])}{' ...' if len(left) > 3 else ''})"
            status = "PASS" if not left else f"FAIL {shown}" if must_be_clean else f"left {shown}"
            print(f"    {item:<34}{status}")
    if killed_after:
        print(f"\n{killed_after} leftover processes of this run were killed after the checks")


if __name__ == "__main__":
    main()
