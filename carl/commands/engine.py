"""`carl engine setup` (build vLLM's environment) and `carl engine serve` (a vLLM server for carl)."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="inference engines: build vLLM's environment, serve a model for carl")
    esub = p.add_subparsers(dest="engine_command", metavar="SUBCOMMAND", required=True)

    s = esub.add_parser("setup", help="create (once) and check vLLM's own virtual environment")
    s.set_defaults(func=_setup)

    v = esub.add_parser(
        "serve",
        help="run a vLLM server with carl's worker extension (for engine.url=...); Ctrl-C stops it",
        description="Serve MODEL with vLLM the way carl needs it (token-in/token-out generation, "
        "weight updates from a carl weights directory, seeded sampling). The endpoints are "
        "unauthenticated: keep --host on a private network.",
    )
    v.add_argument("--model", required=True, help="local Hugging Face model folder")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8011)
    v.add_argument("--max-model-len", type=int, default=4096)
    v.add_argument("--kv-cache-gb", type=int, default=2, help="CPU: GiB of KV cache")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    v.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="weights and compute dtype; auto: bfloat16 on a GPU or a CPU with native bf16 "
                   "(AMX, AVX512-BF16), else float32, as `carl train`'s model.dtype (serve the dtype the "
                   "trainer computes in)")
    v.add_argument("--compile", action="store_true", help="let vLLM compile (slower start, faster decode)")
    v.add_argument("--lora-rank", type=int, default=0,
                   help="serve LoRA adapters of this rank, loaded at run time (a run with model.lora_rank > 0)")
    v.add_argument("--record-routes", action="store_true",
                   help="record MoE expert routes for router replay (turns off prefix caching)")
    v.add_argument("--log", default="vllm.log", help="where the server's output goes")
    v.set_defaults(func=_serve)


def _setup(args) -> int:
    from carl.engine.vllm_env import vllm_python

    print(f"vLLM environment: {vllm_python().parent.parent}")
    return 0


def _serve(args) -> int:
    from pathlib import Path

    from carl.engine.vllm_server import ServerSpec, VLLMServer
    from carl.errors import UserError

    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"--model: {args.model!r} is not a Hugging Face model folder (no config.json)")
    for name in ("port", "max_model_len", "kv_cache_gb"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: got {getattr(args, name)}, expected a positive number")
    if args.lora_rank < 0:
        raise UserError(f"--lora-rank: got {args.lora_rank}, expected 0 (no LoRA) or the adapters' rank")
    native = _native_bf16_here()
    dtype = serve_dtype(args.dtype, native)
    if dtype == "bfloat16" and not native:
        print("warning: --dtype bfloat16 on a CPU without native bf16 (no AMX or AVX512-BF16): prefill runs "
              "about 4.6x slower than --dtype float32 (docs/engine.md)")
    spec = ServerSpec(model=args.model, dtype=dtype, host=args.host, port=args.port, max_model_len=args.max_model_len,
                      kv_cache_gb=args.kv_cache_gb, gpu_memory_utilization=args.gpu_memory_utilization,
                      enforce_eager=not args.compile, lora_rank=args.lora_rank, record_routes=args.record_routes)
    server = VLLMServer(spec, args.log, max_restarts=0)
    server.start()
    print(f"serving {args.model} in {dtype} at {server.url} for carl (engine.url={server.url}); Ctrl-C stops it")
    try:
        while server.alive():
            time.sleep(1.0)
        print(f"the vLLM server exited; last lines of {args.log}:\n{server.tail()}")
        return 1
    finally:
        server.stop()


def serve_dtype(dtype: str, native_bf16: bool) -> str:
    """The dtype a served model computes in: "auto" is bf16 where the server's device computes it
    natively (`_native_bf16_here`: a GPU, or a CPU with AMX or AVX512-BF16), else fp32, the choice
    `carl train` makes for model.dtype (`carl.engine.hf.auto_dtype`). Without
    native bf16 a CPU server in bf16 prefilled 1,024 tokens of SmolLM2-135M in 12.6 s, in fp32 in
    2.7 s (2-core AVX2 Zen 3, 2026-12-06), and a trainer computing in fp32 would score tokens a bf16
    sampler drew."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16 else "float32"


def _native_bf16_here() -> bool:
    """The server's device computes bf16 natively: a GPU (vLLM's CUDA build), or a CPU with AMX or
    AVX512-BF16 (`carl.engine.hf.native_bf16`)."""
    from carl.engine.hf import native_bf16
    from carl.engine.vllm_env import has_cuda

    return has_cuda() or native_bf16("cpu")
