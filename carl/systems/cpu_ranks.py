"""Run a function on W CPU ranks with gloo, in spawned processes: how tests and benchmarks exercise
distributed code on one machine.

The rendezvous is a file in a fresh temp dir (no TCP port to collide with other jobs). Each rank
runs one torch thread, because tests share a few cores. An exception in any rank is raised in the
caller with that rank's traceback. Ranks fork from a forkserver that has imported torch once
(about 2.5 s of CPU saved per rank and call on a 2-core box; the server lives as long as the
calling process).
"""

from __future__ import annotations

import multiprocessing
import tempfile
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_on_cpu_ranks(fn: Callable[..., None], world_size: int, *args) -> None:
    """Call `fn(rank, world_size, *args)` on `world_size` gloo ranks; `fn` must be importable."""
    if world_size < 1:
        raise ValueError(f"world_size: got {world_size}, expected >= 1")
    with tempfile.TemporaryDirectory(prefix="carl-gloo-") as tmp:
        init_method = f"file://{tmp}/rendezvous"
        multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)
        mp.start_processes(
            _rank_main,
            args=(fn, world_size, init_method, args),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )


_PRELOAD = ["torch", "torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed.checkpoint"]


def _rank_main(rank: int, fn: Callable[..., None], world_size: int, init_method: str, args: tuple) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
