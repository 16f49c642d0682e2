"""Lossless delta weight sync on SmolLM2-135M after real AdamW steps: size and speed.

For each learning rate: load the model, take `--steps` AdamW steps of next-token loss on a fixed
random token batch, and after each step encode the new weights against the previous version
(`carl/systems/delta_sync.py`), decode them and check the copy is bit-identical. Prints:

- unchanged: fraction of weights whose bf16 bits did not change in the step
- x full / x zstd: full bf16 weights (and plain zstd of them, same level, measured in this run)
  divided by the compressed delta: the two baselines a sync without deltas would send
- encode / decode GB/s: bf16 weight bytes per second of wall time, one thread; "cpu" columns
  divide by the process's CPU time instead, which is what one core does when the box is shared
  (compare them with `uptime`'s load, printed too). On `--device cuda` the diff runs on the GPU
  (XOR, nonzero, gather) and compression + CRC on the CPU: both parts are reported.

    .venv/bin/python benchmarks/delta_sync.py                 # CPU, 3 steps per lr (minutes)
    python benchmarks/delta_sync.py --device cuda --quick    # GPU, 2 steps per lr (< 60 s)

`--precision bf16` (default) trains the bf16 parameters directly, as the issue asks;
`--precision mixed` keeps fp32 master weights and AdamW state and publishes their bf16 cast,
as a mixed-precision trainer would (small updates then accumulate until they flip a bit).
Note: the offline SmolLM2 weights are dequantised from a Q4_1 GGUF (`carl/engine/smollm2.py`),
which makes plain zstd of the full weights compress better than it would on the original bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import zstandard

from carl.systems.delta_sync import DeltaDecoder, DeltaEncoder, DeltaSyncConfig, bits
from carl.systems.subscriber import published_state


def _load_model(path, dtype):
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM

    if any(Path(path).glob("*.safetensors")) or any(Path(path).glob("*.bin")):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="2 steps per learning rate (default 3)")
    parser.add_argument("--lrs", default="1e-6,1e-5,1e-4", help="comma-separated learning rates")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "mixed"])
    parser.add_argument(
        "--seq-len", type=int, default=None, help="tokens per step (default 32 cpu, 512 cuda)"
    )
    parser.add_argument("--zstd-level", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--model", help="HF folder (default: SmolLM2-135M from the cache); a folder with only "
                        "config.json gets seeded random weights of that shape (for machines without the weights)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    torch.set_num_threads(1)
    steps = 2 if args.quick else 3
    seq_len = args.seq_len or (32 if args.device == "cpu" else 512)
    config = DeltaSyncConfig(snapshot_every=1000, zstd_level=args.zstd_level)

    from carl.engine.smollm2 import smollm2_path

    path = args.model or smollm2_path()
    load_dtype = torch.float32 if args.precision == "mixed" else torch.bfloat16
    ids = torch.randint(0, 49152, (1, seq_len), generator=torch.Generator().manual_seed(0)).to(args.device)

    results = {"device": _device_name(args.device), "precision": args.precision, "seq_len": seq_len}
    results["load_before"] = os.getloadavg()
    print(f"device: {results['device']}  precision: {args.precision}  steps/lr: {steps}  load: {_load()}")
    header = (
        f"{'lr':>7} {'step':>4} {'unchanged':>9} {'delta MB':>8} {'x full':>7} {'x zstd':>7} "
        f"{'enc GB/s':>8} {'cpu':>6} {'dec GB/s':>8} {'cpu':>6}"
    )
    if args.device == "cuda":
        header += (
            f" {'enc: gpu diff ms':>16} {'cpu pack ms':>11} {'dec: cpu unpack ms':>18} {'gpu apply ms':>12}"
        )
    rows = []
    full_bytes = zstd_bytes = None
    for lr in [float(x) for x in args.lrs.split(",")]:
        model = _load_model(path, load_dtype).to(args.device)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        encoder, decoder = DeltaEncoder(config), DeltaDecoder(args.device)
        state = _bf16_state(model)
        if full_bytes is None:
            full_bytes, zstd_bytes, zstd_s = _plain_zstd(state, args.zstd_level)
            print(
                f"full bf16 weights: {full_bytes / 1e6:.1f} MB; plain zstd-{args.zstd_level}: "
                f"{zstd_bytes / 1e6:.1f} MB ({full_bytes / zstd_bytes:.2f}x, {full_bytes / zstd_s / 1e9:.2f} GB/s)"
            )
            results.update(full_bytes=full_bytes, zstd_bytes=zstd_bytes, zstd_gbps=full_bytes / zstd_s / 1e9)
        snapshot, _ = encoder.encode(state)  # version 0
        decoder.apply(snapshot)
        if "snapshot_bytes" not in results:
            results["snapshot_bytes"] = len(snapshot)
            print(
                f"a delta-sync snapshot (byte planes + zstd-{args.zstd_level}): {len(snapshot) / 1e6:.1f} MB"
            )
            print(header)
        for step in range(1, steps + 1):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            state = _bf16_state(model)
            _sync(args.device)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            blob, metrics = encoder.encode(state)
            enc_wall, enc_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            wall0, cpu0 = time.perf_counter(), time.process_time()
            dec_metrics = decoder.apply(blob)
            _sync(args.device)
            dec_wall, dec_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            for name, tensor in state.items():
                if not torch.equal(bits(decoder.state[name]), bits(tensor)):
                    raise SystemExit(f"lr {lr} step {step}: {name} is not bit-identical after decoding")
            row = {
                "lr": lr,
                "step": step,
                "unchanged": 1 - metrics["changed_fraction"],
                "delta_bytes": len(blob),
                "x_full": full_bytes / len(blob),
                "x_zstd": zstd_bytes / len(blob),
                "encode_gbps": full_bytes / enc_wall / 1e9,
                "encode_cpu_gbps": full_bytes / enc_cpu / 1e9,
                "decode_gbps": full_bytes / dec_wall / 1e9,
                "decode_cpu_gbps": full_bytes / dec_cpu / 1e9,
                "diff_ms": metrics["diff_s"] * 1e3,
                "pack_ms": metrics["pack_s"] * 1e3,
                # decode parts: zstd + CRC (with the copy to host) on the CPU; scatter/XOR on the device
                "unpack_ms": (dec_metrics["decode_s"] + dec_metrics["verify_s"]) * 1e3,
                "apply_ms": dec_metrics["apply_s"] * 1e3,
            }
            rows.append(row)
            line = (
                f"{lr:7.0e} {step:4d} {row['unchanged']:9.4f} {len(blob) / 1e6:8.2f} {row['x_full']:7.1f} "
                f"{row['x_zstd']:7.1f} {row['encode_gbps']:8.2f} {row['encode_cpu_gbps']:6.2f} "
                f"{row['decode_gbps']:8.2f} {row['decode_cpu_gbps']:6.2f}"
            )
            if args.device == "cuda":
                line += f" {row['diff_ms']:16.1f} {row['pack_ms']:11.1f} {row['unpack_ms']:18.1f} {row['apply_ms']:12.1f}"
            print(line, flush=True)
        del model, opt, encoder, decoder
    print("median over steps, per lr:")
    for lr in sorted({r["lr"] for r in rows}):
        mine = [r for r in rows if r["lr"] == lr]
        med = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("lr", "step")}
        print(
            f"  lr {lr:.0e}: unchanged {med['unchanged']:.4f}, {med['x_full']:.1f}x smaller than full bf16, "
            f"{med['x_zstd']:.1f}x smaller than zstd of it; encode {med['encode_gbps']:.2f} GB/s "
            f"({med['encode_cpu_gbps']:.2f} per CPU-second), decode {med['decode_gbps']:.2f} GB/s "
            f"({med['decode_cpu_gbps']:.2f})"
        )
    results["rows"], results["load_after"] = rows, os.getloadavg()
    print(f"load: {_load()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def _bf16_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights an inference server would receive: bf16 (a cast of fp32 masters in mixed mode)."""
    return {name: t.to(torch.bfloat16) for name, t in published_state(model).items()}


def _plain_zstd(state: dict[str, torch.Tensor], level: int) -> tuple[int, int, float]:
    compressor = zstandard.ZstdCompressor(level=level)
    arrays = [bits(t).cpu().numpy() for t in state.values()]
    start = time.perf_counter()
    compressed = sum(len(compressor.compress(a)) for a in arrays)
    return sum(a.nbytes for a in arrays), compressed, time.perf_counter() - start


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else f"cpu ({os.cpu_count()} cores visible)"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
