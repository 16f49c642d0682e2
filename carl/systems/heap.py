"""Handing freed heap memory back to the OS (glibc's `malloc_trim`), so a sampler's RSS tracks its live memory.

CPU sampling allocates and frees tensors of every size at every decode step: each layer's KV cache
is re-allocated one position longer, rows join and leave the batch, prefills come and go. glibc
serves an allocation below its mmap threshold from the heap, and it raises that threshold to the
size of any mmapped block freed (up to 32 MiB on 64-bit), so after a few steps nearly every tensor
lives on the heap. Freed heap memory is only returned from the heap's top; free pages below a live
block stay in the process. RSS then grows to the largest heap the churn ever needed and stays there.

Measured 2026-11-28 on the 2-core CPU box. `carl eval` of SmolLM2-135M (bf16, 16 concurrent
episodes, prefix cache on) on 56 held-out micro tasks x 4 samples sat at 11.2 GB RSS after 70
minutes; one `malloc_trim(0)` (called from gdb) took it to 4.5 GB without stopping the eval, and
it was back at 6.4 GB 30 s later: much of the heap is live at the sampler's busiest moments.
`benchmarks/heap_trim.py` (16 episodes x 6 turns, two fresh processes beside another eval): a
trim every 10 s lowered RSS after the load 3.85 -> 2.73 GB (x0.71) but the peak only
4.88 -> 4.64 GB (x0.95); 19 trims took 1.9 s in all; tokens/s x1.09 (within this box's noise).
So trimming keeps a long-lived sampler's resident memory near what it uses, which is what lets
several processes share a machine, while the peak of one busy burst is unchanged.

    trim_heap() -> bool             malloc_trim(0) now; False where libc has none (macOS, musl)
    HeapTrimmer(every_s).maybe_trim()   trim_heap() at most once per every_s seconds (0: never)

`malloc_trim(0)` releases every whole free page of every arena (madvise), not only the top. It
takes each arena's lock while it runs, so other threads' allocations wait that long; pages it
released are faulted back in (zeroed) when the heap grows into them again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import time


@functools.cache
def _malloc_trim():
    """libc's malloc_trim, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        fn = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # no libc found, or a libc without malloc_trim
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Return the process's free heap pages to the OS; True if malloc_trim exists here."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


class HeapTrimmer:
    """Calls `trim_heap()` from a loop at most once per `every_s` seconds; `every_s=0` turns it off."""

    def __init__(self, every_s: float, clock=time.monotonic):
        if every_s < 0:
            raise ValueError(f"heap_trim_s: got {every_s}, expected >= 0 (0 = off)")
        self.every_s = every_s
        self.trims = 0
        self.trim_s = 0.0  # time spent inside malloc_trim
        self._clock = clock
        self._last = clock()

    def maybe_trim(self) -> bool:
        """Trim if `every_s` has passed since the last trim (or since construction); True if it did."""
        if not self.every_s or self._clock() - self._last < self.every_s:
            return False
        t0 = time.perf_counter()
        done = trim_heap()
        self.trim_s += time.perf_counter() - t0
        self._last = self._clock()
        self.trims += done
        return done
