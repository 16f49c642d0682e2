"""A load test of `carl serve` on loopback: concurrent sessions, turn latency, hot swaps, kill -9.

    .venv/bin/python benchmarks/serve_load.py                   # 8 users x 2 tasks, 2 rounds, bwrap
    .venv/bin/python benchmarks/serve_load.py --sessions 16 --backend local --kill

The service runs in its own process (this script with --serve) over a micro world, its engine the
scripted micro expert (carl.online.simulate.ExpertEngine, `--model-latency-s` slept per reply), so
what is measured is the service: HTTP, sandboxes, workspace copies, the store. N simulated users
send requests at once (each one session per task); every 1 s an admin hot-swaps the weights
version. Printed: requests, p50/p99 request latency and turn latency (time between a stream's
turn events), dropped requests (a stream without its "done"), deploys; and the ratio of the p50
request latency over HTTP to that of the same request run in-process on the same machine just
before, with the same concurrency (the service's own overhead). With --kill the service gets SIGKILL mid-load; the store is then
reopened: every session the clients were told about must exist, every request whose "done" they
received must be finished, and SQLite's integrity check must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from carl.harness.agent import EpisodeLimits  # noqa: E402  (after the path insert)
from carl.online.client import ServeClient  # noqa: E402
from carl.online.service import ServeConfig, Service  # noqa: E402
from carl.online.simulate import ExpertEngine, provision, workspace_name  # noqa: E402
from carl.online.store import FeedbackStore, StoreConfig  # noqa: E402
from carl.sandbox.base import SandboxConfig  # noqa: E402

LIMITS = EpisodeLimits(max_turns=8, max_new_tokens=512)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--serve", metavar="ROOT", help=argparse.SUPPRESS)  # the service process
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sessions", type=int, default=8, help="simulated users sending requests at once")
    ap.add_argument("--rounds", type=int, default=2, help="requests per user (each on a new session)")
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "local"])
    ap.add_argument("--model-latency-s", type=float, default=0.2, help="slept before each scripted reply")
    ap.add_argument("--kill", action="store_true", help="SIGKILL the service mid-load, then check the store")
    ap.add_argument("--root", help="work directory (default: a temp dir)")
    ap.add_argument("--out", help="write the per-request results as JSON here")
    args = ap.parse_args()
    if args.serve:
        return serve_process(Path(args.serve), args.port, args.backend, args.model_latency_s)
    root = Path(args.root or tempfile.mkdtemp(prefix="carl-serve-load-"))
    result = run_load(root, args.sessions, args.rounds, args.backend, args.model_latency_s, args.kill)
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def world(root: Path):
    """The micro world's tasks (built once under root/micro)."""
    from carl.micro.world import build_micro_tasks

    return build_micro_tasks(root / "micro", seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=2,
                             backend="local")["eval"]


def build_service(root: Path, backend: str, latency_s: float) -> Service:
    from transformers import AutoTokenizer

    tasks = world(root)
    config = ServeConfig(workspaces=str(root / "ws"), state_dir=str(root / "state"), users_file=str(root / "users"),
                         store=StoreConfig(url=f"sqlite:///{root / 'feedback.db'}"),
                         sandbox=SandboxConfig(backend=backend), limits=LIMITS, max_concurrent_requests=64)
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    return Service(config, ExpertEngine(tokenizer, tasks, slow_s=latency_s))


def serve_process(root: Path, port: int, backend: str, latency_s: float) -> None:
    from carl.online.service import serve

    serve(build_service(root, backend, latency_s), port=port)


def save_tokenizer(root: Path) -> None:
    """A small byte-level tokenizer with a chat template (the scripted engine needs one; no hub)."""
    sys.path.insert(0, str(HERE.parent / "tests"))
    from tiny_hf import tiny_tokenizer

    tiny_tokenizer().save_pretrained(root / "tokenizer")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(root: Path, sessions: int, rounds: int, backend: str, latency_s: float, kill: bool) -> dict:
    tasks = world(root)
    if not (root / "tokenizer").exists():
        save_tokenizer(root)
    names = [f"user{i:03d}" for i in range(sessions)]
    users, admin = provision(tasks, names, root / "ws", root / "users", root / "home")

    # the baseline: one round of the same concurrent requests in-process (no HTTP, no service process)
    service = build_service(root, backend, latency_s)

    def direct(name: str) -> float:
        task = tasks[0]
        sid = service.open_session(name, workspace_name(task))["id"]
        t0 = time.monotonic()
        service.run_request(sid, service.begin_request(name, sid, task.problem_statement), task.problem_statement)
        return time.monotonic() - t0

    with ThreadPoolExecutor(sessions) as pool:
        in_process = list(pool.map(direct, names))
    service.close()

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(root), "--port", str(port), "--backend",
                             backend, "--model-latency-s", str(latency_s)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(root / "serve.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    acknowledged: list[dict] = []  # what clients were told: sessions and finished requests
    lock = threading.Lock()
    stop = threading.Event()

    def one_user(user) -> list[dict]:
        rows = []
        with ServeClient(url, user.token, timeout_s=300) as client:
            for r in range(rounds):
                task = tasks[r % len(tasks)]
                row = {"user": user.name, "round": r, "done": False, "turn_gaps_s": []}
                try:
                    sid = client.open_session(workspace_name(task))["id"]
                    row["session"] = sid
                    t0 = last = time.monotonic()
                    for event in client.ask(sid, task.problem_statement):
                        now = time.monotonic()
                        if event["event"] == "turn":
                            row["turn_gaps_s"].append(now - last)
                        last = now
                        if event["event"] == "done":
                            row.update(done=True, request=event["request"], latency_s=now - t0,
                                       stop_reason=event["stop_reason"], version=event["model_version"])
                except Exception as e:  # noqa: BLE001 - a dropped request is a result, not a crash
                    row["error"] = f"{type(e).__name__}: {e}"[:200]
                rows.append(row)
                with lock:
                    acknowledged.append(row)
                if stop.is_set():
                    break
        return rows

    deploys = []

    def swapper():
        version = 0
        with ServeClient(url, admin) as client:
            while not stop.wait(1.0):
                version += 1
                try:
                    deploys.append(client.deploy(version))
                except Exception:  # noqa: BLE001 - the service was killed
                    return

    t_start = time.monotonic()
    swap = threading.Thread(target=swapper, daemon=True)
    swap.start()
    with ThreadPoolExecutor(sessions) as pool:
        futures = [pool.submit(one_user, u) for u in users]
        if kill:
            while len([a for a in acknowledged if a["done"]]) < max(1, sessions // 2):
                time.sleep(0.05)
            os.killpg(proc.pid, signal.SIGKILL)
        rows = [row for f in futures for row in f.result()]
    wall = time.monotonic() - t_start
    stop.set()
    swap.join(5)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)

    done = [r for r in rows if r["done"]]
    gaps = [g for r in done for g in r["turn_gaps_s"]]
    summary = {"sessions": sessions, "rounds": rounds, "backend": backend, "model_latency_s": latency_s,
               "requests": len(rows), "done": len(done), "dropped": len(rows) - len(done), "wall_s": wall,
               "deploys": len(deploys), "killed": kill,
               "request_p50_s": pct([r["latency_s"] for r in done], 50),
               "request_p99_s": pct([r["latency_s"] for r in done], 99),
               "turn_p50_s": pct(gaps, 50), "turn_p99_s": pct(gaps, 99),
               "in_process_p50_s": statistics.median(in_process)}
    summary["http_over_in_process_p50"] = summary["request_p50_s"] / summary["in_process_p50_s"] if done else None
    summary["store"] = check_store(root, rows)
    return {"summary": summary, "requests": rows, "in_process_s": in_process, "deploys": deploys}


def check_store(root: Path, rows: list[dict]) -> dict:
    """Every session a client heard of exists; every request whose 'done' it received is finished."""
    import sqlite3

    store = FeedbackStore(StoreConfig(url=f"sqlite:///{root / 'feedback.db'}"))
    try:
        missing_sessions = [r["session"] for r in rows if "session" in r and store.get_session(r["session"]) is None]
        unfinished = [(r["session"], r["request"]) for r in rows if r["done"]
                      and (store.get_request(r["session"], r["request"]) or {}).get("finished_at") is None]
    finally:
        store.close()
    integrity = sqlite3.connect(root / "feedback.db").execute("PRAGMA integrity_check").fetchone()[0]
    return {"missing_sessions": len(missing_sessions), "lost_finished_requests": len(unfinished),
            "integrity": integrity}


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode} before it answered")
        try:
            if httpx.get(url + "/v1/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the service did not answer {url}/v1/health within {timeout_s:.0f} s")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


if __name__ == "__main__":
    main()
