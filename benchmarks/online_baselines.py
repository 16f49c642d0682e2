"""Which baseline for one-sample production RL: measured on the rewards of served requests.

    .venv/bin/python benchmarks/online_baselines.py --store sqlite:////tmp/carl-online-loop/feedback.db \
        --out docs/results/online/baselines.json

With one sample per prompt the advantage is reward - b, and the baseline b is as good as it is
close to the reward it is subtracted from: the policy gradient's variance grows with the mean of
(reward - b)^2 (for a b that does not depend on the sampled action). This replays the store's
rewarded requests in store order and, for each, records (reward - b)^2 under every baseline of
`carl.online.batch`, each computed as the cycle computes it:

    running_mean           the cluster's (user/workspace) moving mean of earlier rewards shrunk
                           toward the mean over all clusters, else that mean, else the batch mean
                           (carl.online.batch.Baseline, decay 0.9, prior_count 4)
    running_mean_unshrunk  the same without shrinkage (prior_count 0)
    batch                  the mean reward of the request's batch (the requests one version
                           served), the request's own reward included, as the cycle computes it
    batch_leave_one_out    the same without the request's own reward (a baseline independent of it)
    prompt                 the mean reward of the batch's requests with the same text, the request's
                           own included, as the cycle computes it (the batch mean when no other
                           request shares its text)
    prompt_leave_one_out   the same without the request's own reward (the batch leave-one-out mean
                           when no other request shares its text)
    zero                   no baseline (plain REINFORCE), for reference

Printed: the mean squared advantage of each with its standard error, and the paired difference of
each against `batch_leave_one_out` (per request, its mean and standard error); the per-request
values are written to --out. `distill` has no policy-gradient term and is not in this comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from carl.online.batch import Baseline, group_mean, prompt_key  # noqa: E402  (after the path insert)
from carl.online.signals import SignalWeights, request_reward  # noqa: E402
from carl.online.store import FeedbackStore, StoreConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="feedback store URL")
    ap.add_argument("--decay", type=float, default=0.9)
    ap.add_argument("--out")
    args = ap.parse_args()
    store = FeedbackStore(StoreConfig(url=args.store))
    try:
        rows = replay(store, args.decay)
    finally:
        store.close()
    result = summarize(rows)
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"summary": result, "requests": rows}, indent=1))


def replay(store: FeedbackStore, decay: float) -> list[dict]:
    requests = [r for r in store.finished_requests() if request_reward(r, SignalWeights()) is not None]
    sessions = {r["session_id"]: store.get_session(r["session_id"]) for r in requests}
    by_version: dict[int, list[float]] = {}
    for r in requests:
        by_version.setdefault(r["model_version"], []).append(request_reward(r, SignalWeights()))
    batch_mean = {v: statistics.fmean(xs) for v, xs in by_version.items()}
    by_prompt: dict[tuple[int, str], list[float]] = {}
    for r in requests:
        by_prompt.setdefault((r["model_version"], prompt_key(r)), []).append(request_reward(r, SignalWeights()))
    count = {v: len(xs) for v, xs in by_version.items()}
    running, unshrunk = Baseline(), Baseline(prior_count=0.0)
    rows = []
    for r in requests:
        reward = request_reward(r, SignalWeights())
        s = sessions[r["session_id"]]
        key = f"{s['user']}/{s['workspace']}"
        v, n = r["model_version"], count[r["model_version"]]
        batch_loo = (batch_mean[v] * n - reward) / (n - 1) if n > 1 else 0.0  # without its own reward
        b = {"running_mean": _or(running.value(key), batch_mean[v]),
             "running_mean_unshrunk": _or(unshrunk.value(key), batch_mean[v]),
             "batch": batch_mean[v],
             "batch_leave_one_out": batch_loo,
             "prompt": group_mean(by_prompt[v, prompt_key(r)], batch_mean[v]),
             "prompt_leave_one_out": _leave_one_out(by_prompt[v, prompt_key(r)], reward, batch_loo),
             "zero": 0.0}
        running.add(key, reward, decay)
        unshrunk.add(key, reward, decay)
        rows.append({"id": r["id"], "version": r["model_version"], "cluster": key, "reward": reward,
                     **{f"sq_{name}": (reward - v) ** 2 for name, v in b.items()}})
    return rows


def _leave_one_out(group: list[float], own: float, default: float) -> float:
    return (sum(group) - own) / (len(group) - 1) if len(group) > 1 else default


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


NAMES = ("running_mean", "running_mean_unshrunk", "batch", "batch_leave_one_out", "prompt", "prompt_leave_one_out",
         "zero")


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    out: dict = {"requests": n}
    if n < 2:
        return out
    for name in NAMES:
        xs = [r[f"sq_{name}"] for r in rows]
        out[name] = {"mean_sq_advantage": statistics.fmean(xs), "se": statistics.stdev(xs) / n ** 0.5}
    for name in NAMES:
        if name != "batch_leave_one_out":
            d = [r[f"sq_{name}"] - r["sq_batch_leave_one_out"] for r in rows]
            out[f"{name}_minus_batch_leave_one_out"] = {"mean": statistics.fmean(d), "se": statistics.stdev(d) / n ** 0.5}
    return out


if __name__ == "__main__":
    main()
