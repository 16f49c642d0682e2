import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from carl.systems.heap import HeapTrimmer, _malloc_trim

GLIBC = sys.platform == "linux" and _malloc_trim() is not None


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_trimmer_waits_every_s_between_trims():
    clock = FakeClock()
    trimmer = HeapTrimmer(10.0, clock=clock)
    clock.t = 9.9
    assert not trimmer.maybe_trim()
    clock.t = 10.0
    assert trimmer.maybe_trim() == GLIBC
    clock.t = 19.0
    assert not trimmer.maybe_trim()  # 9 s after the last trim
    clock.t = 20.5
    assert trimmer.maybe_trim() == GLIBC
    assert trimmer.trims == (2 if GLIBC else 0)


def test_trimmer_off_and_bad_interval():
    clock = FakeClock()
    trimmer = HeapTrimmer(0.0, clock=clock)
    clock.t = 1e9
    assert not trimmer.maybe_trim() and trimmer.trims == 0
    with pytest.raises(ValueError, match="heap_trim_s: got -1"):
        HeapTrimmer(-1)


def test_policy_config_rejects_negative_heap_trim():
    from carl.engine.hf import HFEngineConfig

    with pytest.raises(ValueError, match="heap_trim_s: got -0.5"):
        HFEngineConfig(path="x", heap_trim_s=-0.5)


@pytest.mark.skipif(not GLIBC, reason="needs glibc's malloc_trim and /proc")
def test_trim_heap_returns_free_pages_below_a_live_block():
    """Free 64 KiB blocks (below the mmap threshold, so on the heap) under one live block at the
    top: the heap cannot shrink from the top, and only trim_heap gives the pages back."""
    code = textwrap.dedent("""
        import ctypes, sys
        sys.path.insert(0, %r)
        from carl.systems.heap import trim_heap
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes, libc.free.argtypes = [ctypes.c_size_t], [ctypes.c_void_p]
        def rss_mb():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        blocks = [libc.malloc(64 * 1024) for _ in range(3200)]  # 200 MiB
        for b in blocks:
            ctypes.memset(b, 1, 64 * 1024)
        top = libc.malloc(64 * 1024)
        ctypes.memset(top, 1, 64 * 1024)
        for b in blocks:
            libc.free(b)
        before = rss_mb()
        assert trim_heap()
        print(before, rss_mb())
    """ % str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before, after = map(float, out.stdout.split())
    assert before - after > 150, f"RSS {before:.0f} MB -> {after:.0f} MB after trim_heap"
