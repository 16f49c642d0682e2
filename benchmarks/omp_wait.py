"""OpenMP's wait policy when carl's processes share CPU cores: ACTIVE (spin) vs PASSIVE (sleep).

    .venv/bin/python benchmarks/omp_wait.py --seconds 20

On a CPU box the trainer, the vLLM engine and the sandboxed test runs share the same cores. torch's
OpenMP threads spin-wait at the end of each parallel region by default; when another process holds
one of the cores, a spinning thread burns the time slice its sibling needs, and the step slows down
far beyond its fair share. `carl` sets OMP_WAIT_POLICY=PASSIVE for its processes (carl/__init__.py)
unless the user set it. This measures why: a SmolLM2-shaped decoder (4 blocks, random init) runs
forward + backward steps with torch's default threads, alone and beside a second process running
the same steps (the engine's share of the cores), under each policy. Each cell is its own process
(the policy is read when OpenMP loads); printed: steps/s and PASSIVE / ACTIVE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WORKER = r"""
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=4096, hidden_size=576, intermediate_size=1536, num_hidden_layers=4,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=1024)
model = LlamaForCausalLM(cfg)
ids = torch.randint(0, 4096, (4, 256))
def step():
    model(input_ids=ids, labels=ids).loss.backward()
step()
t0, n = time.perf_counter(), 0
while time.perf_counter() - t0 < float(sys.argv[1]):
    step()
    n += 1
print(n / (time.perf_counter() - t0), flush=True)
"""


def cell(policy: str, seconds: float, loaded: bool) -> float:
    """steps/s of one worker under `policy`, beside a second worker (same policy) when `loaded`."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    other = subprocess.Popen([sys.executable, "-c", WORKER, str(seconds + 30)], env=env,
                             stdout=subprocess.DEVNULL) if loaded else None
    try:
        if other is not None:
            time.sleep(3)  # the other worker is past its start-up
        out = subprocess.run([sys.executable, "-c", WORKER, str(seconds)], env=env, capture_output=True, text=True,
                             check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if other is not None:
            other.kill()
            other.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="timed seconds per cell")
    p.add_argument("--repeats", type=int, default=2, help="each cell this many times, interleaved")
    p.add_argument("--out", default="", help="a JSON file for every cell's measurement")
    args = p.parse_args()
    rows = []
    for rep in range(args.repeats):
        for loaded in (False, True):
            for policy in ("ACTIVE", "PASSIVE"):
                rate = cell(policy, args.seconds, loaded)
                rows.append({"repeat": rep, "loaded": loaded, "policy": policy, "steps_per_s": rate})
                print(f"repeat {rep} {'beside a second process' if loaded else 'alone':<24} {policy:<8} "
                      f"{rate:.3f} steps/s", flush=True)
    print(f"\ncpus: {os.cpu_count()}, torch threads per process: default")
    for loaded in (False, True):
        rate = {pol: sum(r["steps_per_s"] for r in rows if r["loaded"] == loaded and r["policy"] == pol) / args.repeats
                for pol in ("ACTIVE", "PASSIVE")}
        print(f"{'beside a second process' if loaded else 'alone':<24} ACTIVE {rate['ACTIVE']:.3f}  "
              f"PASSIVE {rate['PASSIVE']:.3f} steps/s  PASSIVE / ACTIVE = {rate['PASSIVE'] / rate['ACTIVE']:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"seconds": args.seconds, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
