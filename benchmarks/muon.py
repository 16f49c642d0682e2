"""Muon step time: single-device Muon vs ShardedMuon (W = 1 on the same device; W gloo CPU ranks).

    .venv/bin/python benchmarks/muon.py                      # CPU: Muon, ShardedMuon W=1, W=2 gloo
    python benchmarks/muon.py --device cuda                  # one GPU: Muon vs ShardedMuon W=1

The parameters are a stack of same-shape square matrices (one bucket per W of them). Times are
per optimizer step, median of --steps after 2 warm-up steps (best of 2 alternating rounds
for the single-process runs); ratios are against single-device
Muon measured in the same run. On CPU every process uses one thread, so the W-rank number shows
what splitting Newton-Schulz over ranks buys once communication is paid (on a shared 2-core box
that is noisy: compare ratios, not absolute times). With W ranks the reported time is the
slowest rank's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carl.systems.cpu_ranks import run_on_cpu_ranks
from carl.systems.muon import Muon, MuonConfig
from carl.systems.sharded_muon import ShardedMuon


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--num-matrices", type=int, default=16)
    parser.add_argument(
        "--size", type=int, default=None, help="matrix side (default 256 on cpu, 2048 on cuda)"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--world", type=int, default=2, help="gloo CPU ranks for the sharded run (cpu only)")
    args = parser.parse_args()
    size = args.size or (256 if args.device == "cpu" else 2048)
    if args.device == "cpu":
        torch.set_num_threads(1)
    print(
        f"device={args.device} torch={torch.__version__} matrices={args.num_matrices} x {size}x{size} "
        f"steps={args.steps}"
    )

    # Alternate the two single-process runs and keep each one's best round: the first run on a
    # busy machine is often the slow one, whichever it is.
    rounds = [
        [_time_steps(cls, args.num_matrices, size, args.steps, args.device) for cls in (Muon, ShardedMuon)]
        for _ in range(2)
    ]
    results = {
        "Muon (single device)": min(r[0] for r in rounds),
        "ShardedMuon W=1": min(r[1] for r in rounds),
    }
    if args.device == "cpu" and args.world > 1:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            run_on_cpu_ranks(_sharded_rank, args.world, args.num_matrices, size, args.steps, str(out))
            results[f"ShardedMuon W={args.world} gloo"] = json.loads(out.read_text())["step_s"]

    base = results["Muon (single device)"]
    for name, step_s in results.items():
        print(f"{name:28s} {step_s * 1e3:9.2f} ms/step   ratio vs Muon {step_s / base:6.3f}")


def _params(num: int, size: int, device: str) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = []
    for _ in range(num):
        p = torch.nn.Parameter(torch.randn(size, size, generator=gen).to(device))
        p.grad = torch.randn(size, size, generator=gen).to(device)
        params.append(p)
    return params


def _median_step_s(opt: torch.optim.Optimizer, steps: int, device: str) -> float:
    times = []
    for i in range(steps + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_steps(cls, num: int, size: int, steps: int, device: str) -> float:
    return _median_step_s(cls(_params(num, size, device), MuonConfig()), steps, device)


def _sharded_rank(rank: int, world: int, num: int, size: int, steps: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    params = []
    for p in _params(num, size, "cpu"):
        q = torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]))
        q.grad = distribute_tensor(p.grad, mesh, [Shard(0)])
        params.append(q)
    step_s = torch.tensor(_median_step_s(ShardedMuon(params, MuonConfig()), steps, "cpu"))
    torch.distributed.all_reduce(step_s, op=torch.distributed.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_s": step_s.item()}))


if __name__ == "__main__":
    main()
