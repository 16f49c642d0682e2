"""carl's vLLM worker extension: the engine side of lossless delta weight sync, inside vLLM's workers.

vLLM mixes this class into each of its workers (`--worker-extension-cls
carl.engine.vllm_worker.CarlWorkerExtension`) and the server's `/collective_rpc` endpoint calls
its methods there (`VLLMEngine.update_weights`):

    carl_load_version(root, version)
        VersionFollower(root) -> version   (replays deltas; a snapshot when it must; every blob and
                                             every tensor checked with CRC-32, carl.systems.delta_sync)
        model_runner.reload_weights(the transformer blocks and other tensors that changed)
        -> {"crc32": {name: CRC-32 of the bits it loaded}, timings}  or  {"error": ...}

Runs in vLLM's own virtual environment (its torch, its transformers): it imports only
`carl.systems` modules that need torch, numpy and zstandard, from carl's source tree on the
server's PYTHONPATH.

Why whole blocks: vLLM fuses checkpoint tensors (q/k/v into qkv_proj, gate/up into gate_up_proj)
and on CPU repacks linear weights, so a block is reloaded from all of its checkpoint tensors
together, never from one of a fused group alone. What the checksums prove: the tensors handed to
vLLM's loader are bit-identical to the trainer's. vLLM's own repacking of them is checked
functionally, by greedy decodes equal to the trainer's (tests/test_engine_vllm.py) and by the
per-step log-prob mismatch the trainer logs.
"""

from __future__ import annotations

import re
import time
import zlib
from typing import Any

from carl.systems.delta_sync import bits
from carl.systems.subscriber import VersionFollower
from carl.systems.weight_transport import DirectoryTransport

_BLOCK = re.compile(r"^(.*?\.layers\.\d+\.)")


def reload_groups(names: set[str], all_names: set[str]) -> set[str]:
    """The tensors to hand to the loader when `names` changed: every tensor of each transformer
    block (`...layers.N.`) with a change, and each other changed tensor by itself."""
    blocks = {m.group(1) for n in names if (m := _BLOCK.match(n))}
    return set(names) | {n for n in all_names if (m := _BLOCK.match(n)) and m.group(1) in blocks}


class CarlWorkerExtension:
    _carl_follower: VersionFollower | None = None

    def carl_ping(self) -> str:
        return "carl"

    def carl_load_version(self, root: str, version: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        target = int(version)
        follower = self._carl_follower
        if follower is None or str(follower.transport.root) != root:
            follower = self._carl_follower = VersionFollower(DirectoryTransport(root))
        changed = follower.advance(target)
        if follower.version != target:
            return {"error": f"cannot reach weights version {target} (at {follower.version}): "
                             f"{follower.last_error}", "version": follower.version}
        t1 = time.perf_counter()
        state = follower.state
        load = reload_groups(changed, set(state))
        if load:
            self.model_runner.reload_weights(weights_iterator=((n, state[n]) for n in sorted(load)))
        t2 = time.perf_counter()
        crcs = {n: zlib.crc32(bits(state[n]).numpy()) for n in sorted(load)}
        return {"crc32": crcs, "version": target, "decode_s": t1 - t0, "load_s": t2 - t1,
                "crc_s": time.perf_counter() - t2, "tensors_changed": len(changed),
                "tensors_loaded": len(load)}
