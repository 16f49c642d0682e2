"""Run the memory test's four-hog command N times, each in a fresh gVisor sandbox, and count the
(exit code, "survived" printed, stderr) outcomes. Run from the repository root:
    .venv/bin/python docs/results/gvisor-oom-exit-2026-12-06/probe.py 40
"""
import collections
import sys
import tempfile
from pathlib import Path

from carl.sandbox import SandboxConfig, cgroup, open_sandbox

HOG = "import sys; x = bytearray(int(sys.argv[1]) << 20); x[::4096] = bytes(len(x[::4096])); print('big')"

print("cgroup", cgroup.available())
repo = Path(tempfile.mkdtemp())
(repo / "a.txt").write_text("x")
outcomes = collections.Counter()
for i in range(int(sys.argv[1])):
    with open_sandbox(repo, SandboxConfig(backend="gvisor", memory_mb=256)) as sb:
        many = sb.exec(f'for i in 1 2 3 4; do python3 -c "{HOG}" 150 & done; wait; echo survived', timeout_s=30)
    outcomes[(many.exit_code, "survived" in many.stdout, many.stderr[:80])] += 1
    print(i, many.exit_code, repr(many.stdout[:40]), repr(many.stderr[-200:]), flush=True)
print(outcomes)
