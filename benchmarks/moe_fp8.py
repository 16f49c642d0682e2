"""MoE expert layer forward+backward: bf16 vs MXFP8 (emulated) vs per-row FP8 (`torch._scaled_mm`).

Prints, per path, the median step time, its ratio to bf16 measured in the same run, and the
relative error of the output and of both weight gradients against an fp32 reference.

    .venv/bin/python benchmarks/moe_fp8.py                  # CPU, small shapes (~10 s on 2 cores)
    python benchmarks/moe_fp8.py --device cuda              # one GPU, 8 experts, hidden 2048, 4096 tokens

Read the numbers with `carl/systems/moe_fp8.py`'s docstring: "mxfp8_emulated" measures MX
numerics, not speed (quantize + dequantize + a bf16 matmul is always slower than bf16), and
"fp8_rowwise" is the path that can be faster on H100/H200, where MX block scaling has no
hardware support. Quantization here is unfused PyTorch ops; a fused kernel would cut its cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import torch.nn.functional as F

from carl.systems.moe_fp8 import LINEARS, moe_experts_forward

DEFAULTS = {  # (hidden, expert intermediate, tokens) per device
    "cpu": (256, 512, 512),
    "cuda": (2048, 2048, 4096),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--hidden", type=int, help="hidden size (default: 256 on cpu, 2048 on cuda)")
    parser.add_argument("--intermediate", type=int, help="expert intermediate size (default: 512 / 2048)")
    parser.add_argument("--tokens", type=int, help="tokens per step (default: 512 / 4096)")
    parser.add_argument(
        "--iters", type=int, default=None, help="timed steps per path (default: 5 cpu, 20 cuda)"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    hidden, inter, tokens = (
        args.hidden or DEFAULTS[args.device][0],
        args.intermediate or DEFAULTS[args.device][1],
        args.tokens or DEFAULTS[args.device][2],
    )
    iters = args.iters or (5 if args.device == "cpu" else 20)
    device = torch.device(args.device)

    torch.manual_seed(0)
    gate_up_E_2F_H = torch.randn(args.experts, 2 * inter, hidden, device=device) * hidden**-0.5
    down_E_H_F = torch.randn(args.experts, hidden, inter, device=device) * inter**-0.5
    hidden_N_H = torch.randn(tokens, hidden, device=device)
    probs_N_E = torch.softmax(torch.randn(tokens, args.experts, device=device), dim=-1)
    weights_N_K, expert_ids_N_K = probs_N_E.topk(args.top_k, dim=-1)
    weights_N_K = weights_N_K / weights_N_K.sum(-1, keepdim=True)
    grad_out_N_H = torch.randn(tokens, hidden, device=device)

    reference = step(
        hidden_N_H, expert_ids_N_K, weights_N_K, gate_up_E_2F_H, down_E_H_F, grad_out_N_H, F.linear
    )
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    )
    print(
        f"MoE experts fwd+bwd on {device_name}, torch {torch.__version__}: {args.experts} experts, top-{args.top_k}, "
        f"hidden {hidden}, intermediate {inter}, {tokens} tokens, median of {iters}"
    )
    print(f"{'path':<16}{'ms':>10}{'vs bf16':>10}{'err out':>10}{'err dW_up':>11}{'err dW_down':>12}")
    results = {}
    for name, linear in LINEARS.items():
        bf16 = [t.to(torch.bfloat16) for t in (hidden_N_H, gate_up_E_2F_H, down_E_H_F, grad_out_N_H)]
        x, gate_up, down, grad_out = bf16
        run = functools.partial(step, x, expert_ids_N_K, weights_N_K, gate_up, down, grad_out, linear)
        outputs = run()  # warm-up, and the numbers we compare
        times_ms = [timed(run, device) for _ in range(iters)]
        errors = [rel_err(ours, ref) for ours, ref in zip(outputs, reference, strict=True)]
        results[name] = {"ms": statistics.median(times_ms), "err_out": errors[0], "err_grad_gate_up": errors[1],
                         "err_grad_down": errors[2]}  # fmt: skip
    for name, r in results.items():
        r["time_vs_bf16"] = r["ms"] / results["bf16"]["ms"]
        print(
            f"{name:<16}{r['ms']:>10.2f}{r['time_vs_bf16']:>9.2f}x{r['err_out']:>10.4f}"
            f"{r['err_grad_gate_up']:>11.4f}{r['err_grad_down']:>12.4f}"
        )
    print("errors: relative Frobenius norm against an fp32 reference of the same layer")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__, "hidden": hidden, "intermediate": inter,
                       "tokens": tokens, "experts": args.experts, "top_k": args.top_k, "results": results}, f, indent=2)  # fmt: skip


def step(hidden_N_H, expert_ids_N_K, weights_N_K, gate_up_E_2F_H, down_E_H_F, grad_out_N_H, linear):
    """One forward+backward; returns (output, grad of gate_up, grad of down)."""
    gate_up = gate_up_E_2F_H.detach().requires_grad_()
    down = down_E_H_F.detach().requires_grad_()
    out_N_H = moe_experts_forward(hidden_N_H, expert_ids_N_K, weights_N_K, gate_up, down, linear)
    out_N_H.backward(grad_out_N_H)
    return out_N_H.detach(), gate_up.grad, down.grad


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.float() - ref.float()).norm() / ref.float().norm()).item()


if __name__ == "__main__":
    main()
