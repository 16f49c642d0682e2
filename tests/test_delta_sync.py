"""Lossless delta weight sync: bit-exact round trips, corruption and loss recovery, transports."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from carl.systems.cpu_ranks import run_on_cpu_ranks
from carl.systems.delta_sync import (
    CorruptVersionError,
    DeltaDecoder,
    DeltaEncoder,
    DeltaSyncConfig,
    _diff_cpu_,
    _diff_device_,
    _flatnonzero,
    bits,
    read_header,
)
from carl.systems.subscriber import Subscriber, published_state
from carl.systems.weight_transport import BroadcastTransport, DirectoryTransport, MissingVersionError


def _initial_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w_bf16": (torch.randn(257, 129, generator=g) * 0.02).bfloat16(),  # odd sizes: word-tail path
        "b_fp32": torch.randn(1001, generator=g),
        "h_fp16": torch.randn(64, 3, generator=g).half(),
        "step_i64": torch.arange(7),
        "codes_u8": torch.randint(0, 256, (33,), generator=g, dtype=torch.uint8),
        "mask_bool": torch.zeros(5, dtype=torch.bool),
        "scalar_fp32": torch.tensor(0.0),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "frozen": torch.randn(40, generator=g).bfloat16(),  # never changes
    }


def _step(state: dict[str, torch.Tensor], v: int) -> None:
    """A fake optimizer step that changes few bits at most versions and many at some."""
    g = torch.Generator().manual_seed(1000 + v)
    lr = 1e-1 if v % 7 == 3 else 1e-4  # every 7th step rewrites most bf16 weights (XOR wins)
    w = state["w_bf16"].float()
    state["w_bf16"] = (w + lr * torch.randn(w.shape, generator=g).sign()).bfloat16()
    if v % 2:
        state["b_fp32"][v::13] += 1e-3
    state["h_fp16"][v % 64, v % 3] = -state["h_fp16"][v % 64, v % 3]
    state["step_i64"] += 1
    state["codes_u8"][v % 33] ^= 0x5A
    state["mask_bool"][v % 5] = not bool(state["mask_bool"][v % 5])
    state["scalar_fp32"] = -state["scalar_fp32"]  # 0.0 <-> -0.0: equal as floats, not as bits


def _assert_bits_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(bits(got[name]), bits(tensor)), name


def test_round_trip_is_bit_exact_over_many_versions():
    state = _initial_state()
    encoder, decoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=5)), DeltaDecoder()
    encodings = set()
    for v in range(23):
        blob, metrics = encoder.encode(state)
        header = read_header(blob)
        assert header.version == v and metrics["version"] == v
        assert header.is_snapshot == (v % 5 == 0)
        assert header.base_version == (None if v % 5 == 0 else v - 1)
        decoder.apply(blob)
        assert decoder.version == v
        _assert_bits_equal(decoder.state, state)
        encodings |= {(e.name, e.encoding) for e in header.tensors}
        _step(state, v)
    kinds = {enc for _, enc in encodings}
    assert kinds == {"raw", "sparse", "xor", "same"}, "every encoding should have been exercised"
    assert ("frozen", "same") in encodings and ("empty", "same") in encodings
    assert ("scalar_fp32", "xor") in encodings  # the sign flip of 0.0 was sent


def test_few_changed_bits_give_a_small_delta():
    w = (torch.randn(1 << 20) * 0.02).bfloat16()
    encoder = DeltaEncoder(DeltaSyncConfig())
    encoder.encode({"w": w})
    changed = torch.randperm(w.numel())[: w.numel() // 100]
    w2 = w.clone()
    bits(w2)[changed] ^= 1  # flip the lowest mantissa bit of 1% of the weights
    blob, metrics = encoder.encode({"w": w2})
    assert metrics["changed_fraction"] == pytest.approx(0.01, abs=1e-6)
    # per change at most 4 gap bytes + 2 value bytes before zstd: <= 3% of the 2 MiB of weights
    assert len(blob) < 0.03 * w.numel() * 2
    decoder = DeltaDecoder()
    decoder.apply(encoder_snapshot(w))
    decoder.apply(blob)
    assert torch.equal(bits(decoder.state["w"]), bits(w2))


def encoder_snapshot(w: torch.Tensor) -> bytes:
    return DeltaEncoder(DeltaSyncConfig()).encode({"w": w})[0]


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 1003])
def test_word_flatnonzero_matches_numpy(dtype, size):
    rng = np.random.default_rng(size)
    x = np.where(rng.random(size) < 0.1, rng.integers(1, 100, size), 0).astype(dtype)
    assert np.array_equal(_flatnonzero(x), np.flatnonzero(x))


@pytest.mark.parametrize("changed_fraction", [0.0, 0.001, 0.05, 0.3, 1.0])
def test_cpu_diff_matches_the_device_diff(changed_fraction):
    """The GPU path's torch ops, run here on CPU tensors, against the chunked numpy path."""
    old = torch.randint(-(2**15), 2**15, (600_001,), dtype=torch.int16)
    new = old.clone()
    changed = torch.randperm(new.numel())[: int(changed_fraction * new.numel())]
    new[changed] ^= 0x0101
    old_cpu, old_dev = old.clone(), old.clone()
    got = _diff_cpu_(new, old_cpu, np.empty(new.numel(), dtype=np.int16))
    want = _diff_device_(new, old_dev)
    assert got[0] == want[0] == changed.numel()
    for a, b in zip(got[1:], want[1:], strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)
    assert torch.equal(old_cpu, new) and torch.equal(old_dev, new)


def _two_versions() -> tuple[dict, dict, bytes, bytes]:
    s0 = _initial_state()
    encoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=100))
    blob0, _ = encoder.encode(s0)
    s0 = {k: v.clone() for k, v in s0.items()}
    s1 = {k: v.clone() for k, v in s0.items()}
    _step(s1, 1)
    blob1, _ = encoder.encode(s1)
    return s0, s1, blob0, blob1


def test_corrupt_delta_is_detected_and_state_kept():
    s0, s1, blob0, blob1 = _two_versions()
    decoder = DeltaDecoder()
    decoder.apply(blob0)
    flipped = bytearray(blob1)
    flipped[len(flipped) // 2] ^= 0x01
    with pytest.raises(CorruptVersionError, match="CRC"):
        decoder.apply(bytes(flipped))
    with pytest.raises(CorruptVersionError, match="CRC"):
        decoder.apply(blob1[:-10])  # torn write
    assert decoder.version == 0
    _assert_bits_equal(decoder.state, s0)
    decoder.apply(blob1)  # the intact copy still applies
    _assert_bits_equal(decoder.state, s1)


def test_delta_on_wrong_base_bits_fails_checksum_and_is_undone():
    """Same version number, different bits: only the checksum of the decoded bits can tell."""
    _, _, _, blob1 = _two_versions()
    other = _initial_state(seed=1)
    decoder = DeltaDecoder()
    decoder.apply(DeltaEncoder(DeltaSyncConfig()).encode(other)[0])  # also "version 0"
    with pytest.raises(CorruptVersionError, match="CRC-32"):
        decoder.apply(blob1)
    assert decoder.version == 0
    _assert_bits_equal(decoder.state, other)  # partially applied tensors were rolled back


def test_delta_against_another_version_is_refused():
    _, _, blob0, blob1 = _two_versions()
    decoder = DeltaDecoder()
    with pytest.raises(CorruptVersionError, match="delta against 0"):
        decoder.apply(blob1)  # nothing applied yet
    decoder.apply(blob0)
    decoder.apply(blob1)
    with pytest.raises(CorruptVersionError, match="holds version 1"):
        decoder.apply(blob1)


def test_unsupported_dtype_is_refused_before_anything_changes():
    encoder = DeltaEncoder(DeltaSyncConfig())
    with pytest.raises(ValueError, match="'z'.*complex128"):
        encoder.encode({"w": torch.zeros(3), "z": torch.zeros(2, dtype=torch.complex128)})
    assert encoder.next_version == 0


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="snapshot_every"):
        DeltaSyncConfig(snapshot_every=0)
    with pytest.raises(ValueError, match="zstd_level"):
        DeltaSyncConfig(zstd_level=0)
    with pytest.raises(ValueError, match="keep_snapshots"):
        DirectoryTransport("/tmp/x", keep_snapshots=0)


def _publish_versions(transport, encoder, state, versions) -> list[dict]:
    """Publish `versions` steps; returns a copy of the state at each one."""
    copies = []
    for v in versions:
        transport.publish(encoder.encode(state)[0])
        copies.append({k: t.clone() for k, t in state.items()})
        _step(state, v)
    return copies


def test_directory_transport_publishes_atomically_and_prunes(tmp_path):
    transport = DirectoryTransport(tmp_path, keep_snapshots=2, keep_deltas=3)
    assert transport.latest() is None and transport.snapshots() == []
    encoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=4))
    _publish_versions(transport, encoder, _initial_state(), range(11))
    assert transport.latest() == 10
    assert transport.snapshots() == [4, 8]
    files = sorted(os.listdir(tmp_path))
    # snapshots 4 and 8; deltas of the last 3 versions; no temp files left behind
    assert files == [
        "0000000004.snapshot",
        "0000000008.snapshot",
        "0000000009.delta",
        "0000000010.delta",
        "LATEST",
    ]
    assert read_header(transport.fetch(9)).base_version == 8
    with pytest.raises(MissingVersionError, match="version 5"):
        transport.fetch(5)


class _TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 16, dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(16)


def _train_and_publish(model, transport, encoder, versions, lr=1e-2) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for v in versions:
        if v > 0:
            x = torch.randn(4, 32, generator=torch.Generator().manual_seed(v)).bfloat16()
            model.norm(model.proj(x).float()).square().mean().backward()
            opt.step()
            opt.zero_grad()
        transport.publish(encoder.encode(published_state(model))[0])


def test_subscriber_recovers_from_corrupt_delta_via_next_snapshot(tmp_path):
    publisher, live = _TinyModel(), _TinyModel()
    transport = DirectoryTransport(tmp_path)
    encoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=4))
    subscriber = Subscriber(live, transport)
    _train_and_publish(publisher, transport, encoder, range(3))
    assert subscriber.poll() and subscriber.version == 2
    _assert_bits_equal(published_state(live), published_state(publisher))

    _train_and_publish(publisher, transport, encoder, range(3, 4))
    path = tmp_path / "0000000003.delta"
    blob = bytearray(path.read_bytes())
    blob[-20] ^= 0xFF
    path.write_bytes(bytes(blob))
    assert not subscriber.poll()  # version 3 is corrupt and no newer snapshot: wait at 2
    assert subscriber.version == 2 and isinstance(subscriber.last_error, CorruptVersionError)

    _train_and_publish(publisher, transport, encoder, range(4, 7))  # snapshot 4, deltas 5 and 6
    assert subscriber.poll() and subscriber.version == 6
    _assert_bits_equal(published_state(live), published_state(publisher))


def test_subscriber_recovers_from_missing_delta_and_stops_at_gaps(tmp_path):
    publisher, live = _TinyModel(), _TinyModel()
    transport = DirectoryTransport(tmp_path)
    encoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=3))
    _train_and_publish(publisher, transport, encoder, range(7))  # snapshots 0, 3, 6
    expected_at_6 = {k: t.clone() for k, t in published_state(publisher).items()}
    _train_and_publish(publisher, transport, encoder, range(7, 9))
    (tmp_path / "0000000007.delta").rename(tmp_path / "lost")

    subscriber = Subscriber(live, transport)
    assert subscriber.poll()  # newest snapshot 6, then 7 is missing: stays at 6
    assert subscriber.version == 6 and isinstance(subscriber.last_error, MissingVersionError)
    _assert_bits_equal(published_state(live), expected_at_6)
    (tmp_path / "lost").rename(tmp_path / "0000000007.delta")  # the file shows up late
    assert subscriber.poll() and subscriber.version == 8
    _assert_bits_equal(published_state(live), published_state(publisher))


def test_subscriber_in_another_process_ends_bit_identical(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "model")
    root, out, last = tmp_path / "sync", tmp_path / "final.safetensors", 6
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "carl.systems.subscriber", str(root), str(tmp_path / "model")]
    cmd += ["--until-version", str(last), "--save", str(out), "--timeout-s", "90"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        transport = DirectoryTransport(root)
        encoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=4))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
        for v in range(last + 1):
            if v > 0:
                model(input_ids=ids, labels=ids).loss.backward()
                opt.step()
                opt.zero_grad()
            transport.publish(encoder.encode(published_state(model))[0])
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert f"at version {last}" in output
    _assert_bits_equal(load_file(out), {k: v.contiguous() for k, v in published_state(model).items()})


def _broadcast_rank(rank: int, world: int) -> None:
    transport = BroadcastTransport(src=0)
    encoder, decoder = DeltaEncoder(DeltaSyncConfig(snapshot_every=3)), DeltaDecoder()
    state = _initial_state()  # every rank builds the same states, so each can check the result
    for v in range(5):
        blob = transport.broadcast(encoder.encode(state)[0] if rank == 0 else None)
        decoder.apply(blob)
        _assert_bits_equal(decoder.state, state)
        _step(state, v)
    assert decoder.version == 4


@pytest.mark.distributed
def test_broadcast_transport_on_two_gloo_ranks():
    run_on_cpu_ranks(_broadcast_rank, 2)


def test_layering_subscriber_module_imports_without_transformers():
    # the subscriber imports transformers only in main(), so trainers can use it cheaply
    code = "import sys, carl.systems.subscriber; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
