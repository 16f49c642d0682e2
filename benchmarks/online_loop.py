"""The production loop with SmolLM2 on CPU: `carl serve` + simulated users + `carl online` cycles.

    .venv/bin/python benchmarks/online_loop.py --run runs/default --out docs/results/online/loop.json

The service is the real `carl serve` command (a subprocess, bwrap sandboxes) on the run's warm-start
checkpoint (RUN:0, version 0), following a weights dir. Simulated users (carl.online.simulate)
each send one request per task of the run's RL split per round; they keep an edit when the task's
tests pass on their checkout, else revert it and write a follow-up. After each round of traffic,
one `carl online` cycle (carl.online.cycle.OnlineLoop, in this process) trains on what the deployed
version served, gates the candidate on the run's held-out eval split and a replay of recent
requests (paired, one seed), and hot-swaps it in when it passes.

Then the two failure paths, on the same service:
  degraded   a candidate trained on inverted advantages (lr x --degrade-lr-factor): the gate must block it
  rollback   that candidate deployed anyway (bypassing the gate), a round of traffic, a cycle: the
             live kept rate falls below the previous version's and the cycle must roll it back

`--phase cycles` runs the improvement cycles only and `--phase failures` only the two failure
paths, continuing what a cycles run left in --work (its store, loop state and deployed version;
new simulated users, since tokens are shown once): the two can run at different times.

Written to --out: every request's outcome (user, task, version, passed, latency), every cycle's
report, and the kept-edit rate per version with its binomial standard error; plots next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from carl.online.client import ServeClient  # noqa: E402  (after the path insert)
from carl.online.cycle import GateConfig, OnlineConfig, OnlineLoop, RollbackConfig, paired_binary, plot_kept_rates  # noqa: E402
from carl.online.simulate import act, kept_rate, provision  # noqa: E402
from carl.online.store import StoreConfig  # noqa: E402
from carl.sandbox.base import SandboxConfig  # noqa: E402
from carl.tasks import load_tasks  # noqa: E402
from carl.train.config import RLConfig  # noqa: E402
from carl.train.state import branch_task_files  # noqa: E402
from serve_load import free_port, wait_healthy  # noqa: E402  (benchmarks/, next to this file)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default="runs/default", help="a finished `carl train` run (its micro world and step 0)")
    ap.add_argument("--base-step", type=int, default=0)
    ap.add_argument("--users", type=int, default=3)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4, help="the embedded default's RL learning rate")
    ap.add_argument("--gate-samples", type=int, default=1, help="samples per bench task in the gate")
    ap.add_argument("--steps", type=int, default=2, help="RL steps per cycle")
    ap.add_argument("--baseline", default="prompt", help="online.baseline (carl.online.batch.BASELINES)")
    ap.add_argument("--degrade-lr-factor", type=float, default=10.0)
    ap.add_argument("--work", default="/tmp/carl-online-loop")
    ap.add_argument("--out", default="docs/results/online/loop.json")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--phase", choices=["all", "cycles", "failures"], default="all",
                    help="cycles: the improvement cycles only; failures: only the degraded candidate and the "
                    "rollback, continuing the service, store and loop state a `cycles` run left in --work")
    args = ap.parse_args()

    run, work = Path(args.run), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    files = branch_task_files(run)  # the run's own RL and held-out tasks (its micro.templates' cut, if any)
    traffic_tasks = load_tasks(files["rl_tasks"], require_repos=True)
    sandbox = SandboxConfig(backend="bwrap")
    prefix = "late" if args.phase == "failures" else "user"  # tokens are shown once: a later phase adds users
    users, admin = provision(traffic_tasks, [f"{prefix}{i}" for i in range(args.users)], work / "ws", work / "users",
                             work / "home", admin=f"{prefix}-admin")
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    store = StoreConfig(url=f"sqlite:///{work / 'feedback.db'}")
    serve = subprocess.Popen(
        [sys.executable, "-m", "carl", "serve", "--checkpoint", f"{run}:{args.base_step}", "--workspaces",
         str(work / "ws"), "--state-dir", str(work / "state"), "--users-file", str(work / "users"), "--store-url",
         store.url, "--weights-dir", str(work / "weights"), "--port", str(port), "--sandbox", "bwrap"],
        start_new_session=True, stdout=open(work / "serve.log", "wb"), stderr=subprocess.STDOUT)
    os.environ["CARL_ONLINE_TOKEN"] = admin
    outcomes: list[dict] = []
    reports: list[dict] = []
    try:
        wait_healthy(url, serve)
        cfg = OnlineConfig(base=f"{run}:{args.base_step}", weights_dir=str(work / "weights"),
                           run_dir=str(work / "online"), serve_url=url, workspaces=str(work / "ws"), store=store,
                           min_requests=8, signal_wait_s=0.0, rl=RLConfig(steps=args.steps, lr=args.lr),
                           baseline=args.baseline,
                           gate=GateConfig(eval_tasks=files["eval_tasks"],
                                           samples_per_task=args.gate_samples, replay_requests=4),
                           rollback=RollbackConfig(min_requests=8, z=1.0), cadence_s=0)
        loop = OnlineLoop(cfg)

        def round_of_traffic(label: str) -> None:
            with ThreadPoolExecutor(len(users) * 2) as pool:
                jobs = [pool.submit(one, u, t) for u in users for t in traffic_tasks]
                rows = [j.result() for j in jobs]
            for r in rows:
                r["phase"] = label
            outcomes.extend(rows)
            p, se = kept_rate(rows)
            print(f"[{label}] {len(rows)} requests on v{rows[0]['model_version']}: kept {p:.3f} +- {se:.3f}", flush=True)

        def one(user, task):
            with ServeClient(url, user.token, timeout_s=1800) as client:
                return act(user, client, task, sandbox)

        if args.phase in ("all", "cycles"):
            for c in range(args.cycles):
                round_of_traffic(f"cycle{c + 1}")
                reports.append(loop.run_cycle())
                save(args.out, outcomes, reports, loop)
            round_of_traffic("final")  # the last deployed version's own traffic
            save(args.out, outcomes, reports, loop)
        if args.phase == "cycles":
            return

        # a degraded candidate: inverted advantages, a larger step; the gate must block it
        from carl.online.batch import Baseline, build_batch

        served = loop.store.finished_requests()  # everything served so far
        batch = build_batch(served, loop._cluster_of, cfg.signals, Baseline(), "batch")
        for r in batch.rollouts:
            r.advantage = -r.advantage
        version = loop.state.next_version
        loop.state.next_version += 1
        loop.cfg = dataclasses.replace(cfg, rl=RLConfig(steps=args.steps, lr=args.lr * args.degrade_lr_factor))
        loop.train_cfg = dataclasses.replace(loop.train_cfg, rl=loop.cfg.rl)
        candidate, metrics = loop.train_candidate(batch.rollouts, version)
        gate = loop.gate(candidate, served)
        reports.append({"cycle": "degraded", "train": metrics, "gate": gate,
                        "decision": "blocked" if not gate["pass"] else "passed"})
        print(f"[degraded] gate: {'BLOCKED' if not gate['pass'] else 'passed'} {gate['reasons']} "
              f"bench {gate['bench']}", flush=True)
        # deployed anyway: bad live signals must roll it back
        loop._deploy({"version": version, "model": str(candidate)}, reason="forced (benchmark)")
        loop.state.save(loop.state_path)
        round_of_traffic("degraded-live")
        reports.append(loop.run_cycle())
        round_of_traffic("after-rollback")
        save(args.out, outcomes, reports, loop)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(60)


def save(out: str, outcomes: list[dict], reports: list[dict], loop: OnlineLoop) -> None:
    versions: dict[int, list[bool]] = {}
    for o in outcomes:
        versions.setdefault(o["model_version"], []).append(o["passed"])
    per_version = {v: {"n": len(xs), "kept": sum(xs) / len(xs),
                       "se": (sum(xs) / len(xs) * (1 - sum(xs) / len(xs)) / len(xs)) ** 0.5}
                   for v, xs in sorted(versions.items())}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"per_version": per_version, "vs_first": vs_first(outcomes),
                                "reports": reports, "outcomes": outcomes,
                                "state": loop.state.__dict__}, indent=1, default=str))
    plot_kept_rates(loop.store, loop.state, path.with_suffix(".png"))


def vs_first(outcomes: list[dict]) -> dict[int, dict]:
    """Each later version's kept-edit rate minus the first version's: unpaired (difference of two
    binomial rates, SE from both) and paired on the (user, task) requests both versions served."""
    by: dict[int, dict[tuple[str, str], dict]] = {}
    for o in outcomes:
        by.setdefault(o["model_version"], {})[o["user"], o["task"]] = o
    if not by:
        return {}
    first = min(by)
    out = {}
    for v in sorted(by):
        if v == first:
            continue
        (pa, sa), (pb, sb) = kept_rate(list(by[first].values())), kept_rate(list(by[v].values()))
        common = sorted(set(by[first]) & set(by[v]))
        paired = paired_binary([by[first][k]["passed"] for k in common], [by[v][k]["passed"] for k in common])
        out[v] = {"first": first, "diff": pb - pa, "se": (sa ** 2 + sb ** 2) ** 0.5, "paired_n": paired["n"],
                  "paired_diff": paired["diff"], "paired_se": paired["se"]}
    return out


if __name__ == "__main__":
    main()
