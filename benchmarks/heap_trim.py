"""Peak memory and sampling speed with and without handing free heap pages back (`carl.systems.heap`).

    .venv/bin/python benchmarks/heap_trim.py --quick     # tiny random model, ~1 min on 2 cores
    .venv/bin/python benchmarks/heap_trim.py             # SmolLM2-135M, 16 episodes x 6 turns

Runs benchmarks/sampler.py's agent load (episode threads sharing one HFEngine, as RL and eval do)
in fresh processes, one with `heap_trim_s=0` (never trim) and one with the policy's default, in
the order off, on, off, on for --repeats 2. Each process reports its peak RSS (VmHWM) after the
load, its RSS then, and its generated tokens/s; this prints them per run and the ratios of the
medians (trim / no trim). Separate processes, because a process's heap and its peak RSS carry over
from one load to the next. Any extra arguments go to sampler.py (e.g. --episodes 32 --turns 8).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from carl.engine.hf import HFEngineConfig  # noqa: E402  (after the path insert)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sampler.py --quick (tiny random model)")
    p.add_argument("--repeats", type=int, default=1, help="processes per setting, interleaved")
    p.add_argument("--trim-s", type=float, default=HFEngineConfig.heap_trim_s, help="the trimmed runs' heap_trim_s")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args, extra = p.parse_known_args()
    if args.repeats < 1 or args.trim_s <= 0:
        p.error(f"--repeats {args.repeats}, --trim-s {args.trim_s}: expected >= 1 and > 0")
    sampler = ["--quick"] if args.quick else ["--episodes", "16", "--turns", "6"]
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, trim in (("off", 0.0), ("on", args.trim_s)):
                out = Path(tmp) / f"{name}{r}.json"
                cmd = [sys.executable, str(HERE / "sampler.py"), *sampler, *extra,
                       "--heap-trim-s", str(trim), "--json", str(out)]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"sampler.py failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
                result = json.loads(out.read_text())
                if "rss_peak_gb" not in result:
                    raise SystemExit("no RSS in sampler.py's output: this benchmark needs Linux's /proc")
                runs[name].append(result)
                print(f"heap trim {name:>3} (every {trim:g} s): peak RSS {result['rss_peak_gb']:.2f} GB, "
                      f"RSS after {result['rss_gb']:.2f} GB, {result['tokens_per_s']:.0f} tok/s, "
                      f"{result['heap_trims']} trims in {result['heap_trim_time_s']:.2f} s", flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    summary = {key: median("on", key) / median("off", key) for key in ("rss_peak_gb", "rss_gb", "tokens_per_s")}
    print(f"trim / no trim: peak RSS x{summary['rss_peak_gb']:.2f}, RSS after the load x{summary['rss_gb']:.2f}, "
          f"tokens/s x{summary['tokens_per_s']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "ratio_on_over_off": summary}, indent=2))


if __name__ == "__main__":
    main()
