"""Weight transports for delta sync: a directory (local or shared) and torch.distributed broadcast.

A transport moves version blobs (`carl/systems/delta_sync.py`) from one publisher to readers;
it never looks inside them except for the header's version number and snapshot flag.

Directory layout (`DirectoryTransport(root)`):

    root/0000000000.snapshot   full weights at version 0
    root/0000000001.delta      version 1 against 0
    ...
    root/LATEST                the newest complete version number, as text

A publisher writes each blob to a hidden temp file in `root`, fsyncs it and `os.replace`s it to
its final name, then replaces `LATEST` the same way; a reader that lists the directory or reads
`LATEST` therefore sees only complete files (rename is atomic on local file systems and on NFS
within one directory). Old files are deleted as new ones land: all but the newest
`keep_snapshots` snapshots, and deltas that are older than the oldest kept snapshot or more than
`keep_deltas` versions behind the newest. A reader may race with a deletion: `fetch` then
raises `MissingVersionError`, which the subscriber handles like any missing version.

`BroadcastTransport` sends a blob from one rank to all ranks of a torch.distributed group: an
int64 size header, then the bytes as a uint8 tensor (on `device`: CPU for gloo, CUDA for NCCL).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from carl.io import atomic_write_bytes
from carl.systems.delta_sync import read_header

_NAME = re.compile(r"^(\d{10})\.(snapshot|delta)$")


class MissingVersionError(Exception):
    """The transport has no blob for the requested version (never written, deleted, or lost)."""


class DirectoryTransport:
    """Versions as files in one directory; safe for one publisher and any number of readers."""

    def __init__(self, root: str | Path, keep_snapshots: int = 2, keep_deltas: int = 50) -> None:
        if keep_snapshots < 1:
            raise ValueError(f"keep_snapshots: got {keep_snapshots}, expected >= 1")
        if keep_deltas < 1:
            raise ValueError(f"keep_deltas: got {keep_deltas}, expected >= 1")
        self.root = Path(root)
        self.keep_snapshots = keep_snapshots
        self.keep_deltas = keep_deltas

    def publish(self, blob: bytes) -> int:
        """Write `blob` under its version, point LATEST at it, prune old files; returns the version."""
        header = read_header(blob)
        kind = "snapshot" if header.is_snapshot else "delta"
        atomic_write_bytes(self.root / f"{header.version:010d}.{kind}", blob)
        if header.is_snapshot:  # a version sent again as a snapshot (recovery): `fetch` must not
            (self.root / f"{header.version:010d}.delta").unlink(missing_ok=True)  # find the old delta
        atomic_write_bytes(self.root / "LATEST", f"{header.version}\n".encode())
        self._prune(header.version)
        return header.version

    def latest(self) -> int | None:
        """The newest published version, or None before the first publish."""
        try:
            return int((self.root / "LATEST").read_text())
        except FileNotFoundError:
            return None

    def fetch(self, version: int) -> bytes:
        """The blob of `version` (snapshot or delta); raises MissingVersionError if absent."""
        for kind in ("delta", "snapshot"):
            try:
                return (self.root / f"{version:010d}.{kind}").read_bytes()
            except FileNotFoundError:
                continue
        raise MissingVersionError(f"version {version}: no file in {self.root}")

    def snapshots(self) -> list[int]:
        """Versions that have a snapshot file, oldest first."""
        return sorted(v for v, kind in self._listing() if kind == "snapshot")

    def _listing(self) -> list[tuple[int, str]]:
        if not self.root.is_dir():
            return []
        return [(int(m[1]), m[2]) for name in os.listdir(self.root) if (m := _NAME.match(name))]

    def _prune(self, newest: int) -> None:
        listing = self._listing()
        snapshots = sorted(v for v, kind in listing if kind == "snapshot")
        kept_snapshots = snapshots[-self.keep_snapshots :]
        oldest_needed = kept_snapshots[0] if kept_snapshots else 0
        for version, kind in listing:
            drop = (
                version not in kept_snapshots
                if kind == "snapshot"
                else version < oldest_needed or version <= newest - self.keep_deltas
            )
            if drop:
                (self.root / f"{version:010d}.{kind}").unlink(missing_ok=True)


class BroadcastTransport:
    """Broadcast blobs from rank `src` to every rank of `group` (default: the world)."""

    def __init__(self, src: int = 0, group: dist.ProcessGroup | None = None, device: str = "cpu") -> None:
        self.src = src
        self.group = group
        self.device = torch.device(device)

    def broadcast(self, blob: bytes | None) -> bytes:
        """Call on every rank; `src` passes the blob, others pass None; all get the blob back."""
        is_src = dist.get_rank(self.group) == self.src
        if is_src and blob is None:
            raise ValueError("broadcast: the source rank must pass a blob")
        size = torch.tensor([len(blob) if is_src else 0], dtype=torch.int64, device=self.device)
        src = dist.get_global_rank(self.group, self.src) if self.group is not None else self.src
        dist.broadcast(size, src=src, group=self.group)
        if is_src:
            data = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        dist.broadcast(data, src=src, group=self.group)
        return blob if is_src else data.cpu().numpy().tobytes()
