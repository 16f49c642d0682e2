"""A subscriber: keeps a live Hugging Face model at the newest weights version a directory offers.

    trainer process                          inference process
    ---------------                          -----------------
    optimizer.step()
    blob, _ = encoder.encode(published_state(model))
    transport.publish(blob)  --- root/ --->  subscriber.poll()   # every poll_interval_s
                                               fetch v+1..latest, decode, verify CRC
                                               param.data.copy_(...) under no_grad

The subscriber decodes into its own CPU copy (`DeltaDecoder`), so the model may live on any
device, and copies every parameter into the model after each poll that advanced the version.

Recovery: a missing or corrupt version (`MissingVersionError`, `CorruptVersionError`) stops
the replay at the last verified version. The subscriber then loads the newest intact snapshot
newer than what it holds and replays the intact deltas after it; if there is none yet, it keeps
its weights and version and retries on the next poll, i.e. it waits for the next snapshot.
Versions must only grow: a publisher that restarts its numbering needs a fresh directory.

    python -m carl.systems.subscriber ROOT MODEL_DIR --until-version 20 --save out.safetensors
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from carl.systems.delta_sync import CorruptVersionError, DeltaDecoder, read_header
from carl.systems.weight_transport import DirectoryTransport, MissingVersionError

log = logging.getLogger(__name__)


def published_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a publisher sends: every parameter by name (tied weights once), detached."""
    return {name: p.detach() for name, p in model.named_parameters()}


class VersionFollower:
    """A decoded copy of the published weights that follows a transport to a target version.

    Used by every receiver: `Subscriber` (a live HF model polling a directory), the in-process
    reference engine and the vLLM worker extension (`carl.engine`). Going forward it replays the
    deltas after its version; when one is missing or corrupt, or when asked for an older version
    (a trainer resumed from an earlier checkpoint), it starts again from the newest usable
    snapshot at or below the target and replays from there.
    """

    def __init__(self, transport: DirectoryTransport, device: str = "cpu") -> None:
        self.transport = transport
        self.decoder = DeltaDecoder(device)
        self.last_error: Exception | None = None  # the latest missing/corrupt version seen

    @property
    def version(self) -> int | None:
        return self.decoder.version

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self.decoder.state

    def advance(self, target: int) -> set[str]:
        """Move towards `target`; returns the names of the tensors whose bits changed (every
        tensor after a snapshot). It stops at the last verified version when `target` cannot be
        reached (`version != target` afterwards; `last_error` says why)."""
        changed: set[str] = set()
        if self.version == target:
            return changed
        forward = self.version is not None and self.version < target
        if forward and self._replay(target, changed):
            return changed
        for snapshot in reversed(self.transport.snapshots()):
            if snapshot > target or (forward and snapshot <= self.version):
                continue
            try:
                self.decoder.apply(self.transport.fetch(snapshot))
            except (MissingVersionError, CorruptVersionError) as err:
                self.last_error = err
                log.warning("delta sync: snapshot %d unusable (%s)", snapshot, err)
                continue
            changed.update(self.decoder.state)
            self._replay(target, changed)
            break
        return changed

    def _replay(self, target: int, changed: set[str]) -> bool:
        """Apply the versions after the current one up to `target`; False at the first bad one."""
        for version in range(self.version + 1, target + 1):
            try:
                blob = self.transport.fetch(version)
                self.decoder.apply(blob)
            except (MissingVersionError, CorruptVersionError) as err:
                self.last_error = err
                log.warning("delta sync: version %d unusable (%s); staying at %s", version, err, self.version)
                return False
            changed.update(e.name for e in read_header(blob).tensors if e.encoding != "same")
        return True


class Subscriber:
    """A live Hugging Face model kept at the newest version its transport offers."""

    def __init__(self, model: torch.nn.Module, transport: DirectoryTransport) -> None:
        self.model = model
        self.transport = transport
        self.follower = VersionFollower(transport)
        self._params = dict(model.named_parameters())

    @property
    def version(self) -> int | None:
        """The version now in the model (None before the first one arrives)."""
        return self.follower.version

    @property
    def last_error(self) -> Exception | None:
        return self.follower.last_error

    def poll(self) -> bool:
        """Catch up to the transport's newest version; True when the model's weights changed."""
        latest = self.transport.latest()
        if latest is None or (self.version is not None and latest <= self.version):
            return False
        changed = self.follower.advance(latest)
        if not changed:
            return False
        load_into(self.model, self.follower.state, changed, self._params)
        return True

    def run(self, until_version: int, poll_interval_s: float = 0.2, timeout_s: float | None = None) -> None:
        """Poll until the model holds `until_version` or later; TimeoutError after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.poll()
            if self.version is not None and self.version >= until_version:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"subscriber: still at version {self.version} after {timeout_s} s, waiting for "
                    f"{until_version}; last error: {self.last_error}"
                )
            time.sleep(poll_interval_s)


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], names: set[str],
              params: dict[str, torch.nn.Parameter] | None = None) -> None:
    """Copy the tensors `names` of a decoded `state` into the model's parameters of those names
    (cast to the parameter's dtype); ValueError when the published names differ from the model's."""
    params = dict(model.named_parameters()) if params is None else params
    if state.keys() != params.keys():
        missing, extra = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
        raise ValueError(
            f"published weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    with torch.no_grad():
        for name in names:
            params[name].data.copy_(state[name])


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Apply delta-sync versions from ROOT to the HF model in MODEL_DIR."
    )
    parser.add_argument("root", help="DirectoryTransport folder the publisher writes to")
    parser.add_argument(
        "model_dir", help="Hugging Face model folder (its weights are replaced as versions arrive)"
    )
    parser.add_argument("--until-version", type=int, required=True, help="stop once this version is applied")
    parser.add_argument("--save", help="write the final parameters to this .safetensors file")
    parser.add_argument("--timeout-s", type=float, default=None)
    parser.add_argument("--poll-interval-s", type=float, default=0.1)
    args = parser.parse_args()
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype="auto")
    subscriber = Subscriber(model, DirectoryTransport(args.root))
    subscriber.run(args.until_version, args.poll_interval_s, args.timeout_s)
    if args.save:
        save_file({n: t.contiguous() for n, t in published_state(model).items()}, args.save)
    print(f"subscriber: at version {subscriber.version}")


if __name__ == "__main__":
    main()
