"""The trainer's side of weight sync: every version of the weights, as the engines hold them, in one
directory of lossless delta blobs that every engine follows.

    publish(model, v): cast the trainer's (fp32 master) weights to the engine dtype
                       -> DeltaEncoder: a snapshot every `snapshot_every` versions (and first),
                          else only what changed since v - 1 (carl.systems.delta_sync)
                       -> DirectoryTransport: atomic files, old ones pruned
    push(engine, v):   engine.update_weights(v): the engine follows the directory to v, loads the
                       tensors that changed, and returns their CRC-32 computed on its own copy
                       -> each equals the trainer's, or WeightSyncError names the tensor
                       an engine that cannot load v (a corrupt or missing blob) gets v again as a
                       snapshot and one more try

A new trainer process (a fresh run or a resume) empties the directory and starts with a
snapshot of its current version (`carl online`, whose service may restart at any time, keeps
the directory and numbers on above it): versions in one directory only grow, and a restarted or
freshly started engine catches up from the newest snapshot (`VersionFollower`).

The directory must be readable by the engine: the run directory for an engine on this machine,
a shared mount for one elsewhere.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from carl.engine.base import Engine, WeightSyncError
from carl.systems.delta_sync import DeltaEncoder, DeltaSyncConfig, VersionHeader, read_header
from carl.systems.subscriber import published_state
from carl.systems.weight_transport import DirectoryTransport


@dataclass
class Published:
    """One version as the trainer published it."""

    version: int
    header: VersionHeader
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def crcs(self) -> dict[str, int]:
        return {e.name: e.crc32 for e in self.header.tensors}

    @property
    def changed(self) -> set[str]:
        return {e.name for e in self.header.tensors if e.encoding != "same"}


class WeightStore:
    def __init__(self, root: str | Path, dtype: torch.dtype, config: DeltaSyncConfig = DeltaSyncConfig(),
                 keep_existing: bool = False):
        """`keep_existing`: leave the versions already in `root` (a serving engine that restarts may
        still need them); the next publish, a snapshot, must then number above them."""
        self.root = Path(root)
        self.dtype = dtype
        self.config = config
        if not keep_existing:
            shutil.rmtree(self.root, ignore_errors=True)  # a new numbering (see module docstring)
        self.root.mkdir(parents=True, exist_ok=True)
        self.transport = DirectoryTransport(self.root)
        self.encoder = DeltaEncoder(config)
        self._last: tuple[int, dict[str, torch.Tensor]] | None = None

    def publish(self, weights: torch.nn.Module | Mapping[str, torch.Tensor], version: int) -> Published:
        """Encode and write `version` of the weights (a model, or its published tensors by name) in
        the engine dtype."""
        t0 = time.perf_counter()
        named = published_state(weights) if isinstance(weights, torch.nn.Module) else weights
        state = {name: t.to(self.dtype) for name, t in named.items()}
        if version != self.encoder.next_version:  # not the successor of the last one: start over
            self.encoder = DeltaEncoder(self.config, first_version=version)
        t1 = time.perf_counter()
        blob, m = self.encoder.encode(state)
        t2 = time.perf_counter()
        self.transport.publish(blob)
        self._last = (version, state)
        metrics = {
            "sync/bytes": float(m["blob_bytes"]),
            "sync/bytes_ratio": m["blob_bytes"] / max(m["raw_bytes"], 1),
            "sync/changed_fraction": m["changed_fraction"],
            "sync/snapshot": m["snapshot"],
            "sync/cast_s": t1 - t0,
            "sync/encode_s": t2 - t1,
            "sync/write_s": time.perf_counter() - t2,
        }
        return Published(version, read_header(blob), metrics)

    def republish_snapshot(self, version: int) -> Published:
        """Write the last published version again, as a snapshot (recovery from a bad blob)."""
        if self._last is None or self._last[0] != version:
            raise WeightSyncError(f"version {version} is not the last published one; cannot resend it")
        blob, _ = DeltaEncoder(self.config, first_version=version).encode(self._last[1])
        self.transport.publish(blob)
        return Published(version, read_header(blob))

    def push(self, engine: Engine, published: Published) -> dict[str, float]:
        """Bring `engine` to `published.version` and check its checksums; returns sync metrics."""
        t0 = time.perf_counter()
        try:
            reply = engine.update_weights(published.version)
        except WeightSyncError:
            self.republish_snapshot(published.version)
            reply = engine.update_weights(published.version)  # a second failure propagates
            published.metrics["sync/recovered"] = 1.0
        check_checksums(published, reply["crc32"])
        return {**published.metrics, "sync/apply_s": time.perf_counter() - t0,
                **{f"sync/engine_{k}": float(v) for k, v in reply.items() if k != "crc32"}}


def check_checksums(published: Published, engine_crcs: dict[str, Any]) -> None:
    """Every tensor this version changed has the trainer's CRC-32 engine-side; so does every other
    tensor the engine reports (e.g. all of them after it loaded a snapshot)."""
    ours = published.crcs
    missing = sorted(published.changed - engine_crcs.keys())
    if missing:
        raise WeightSyncError(
            f"weights version {published.version}: the engine did not load {len(missing)} changed "
            f"tensor(s), first {missing[0]!r}"
        )
    for name, crc in sorted(engine_crcs.items()):
        if name not in ours:
            raise WeightSyncError(f"weights version {published.version}: the engine reports tensor "
                                  f"{name!r}, which the trainer does not publish")
        if int(crc) != ours[name]:
            raise WeightSyncError(
                f"weights version {published.version}: tensor {name!r} differs engine-side (CRC-32 "
                f"{int(crc):#010x}, trainer {ours[name]:#010x}); the run stops rather than train on "
                "rollouts from other weights"
            )
