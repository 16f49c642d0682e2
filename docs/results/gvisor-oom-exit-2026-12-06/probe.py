import sys, collections
sys.path.insert(0, "tests")
from carl.sandbox import cgroup
print("cgroup", cgroup.available())
from test_sandbox_gvisor import sandbox  # noqa
import pathlib, tempfile, shutil
repo = pathlib.Path(tempfile.mkdtemp()); (repo/"a.txt").write_text("x")
hog = "import sys; x = bytearray(int(sys.argv[1]) << 20); x[::4096] = bytes(len(x[::4096])); print('big')"
c = collections.Counter()
for i in range(int(sys.argv[1])):
    with sandbox(repo, memory_mb=256) as sb:
        many = sb.exec(f'for i in 1 2 3 4; do python3 -c "{hog}" 150 & done; wait; echo survived', timeout_s=30)
    c[(many.exit_code, "survived" in many.stdout, many.stderr[:80])] += 1
    print(i, many.exit_code, repr(many.stdout[:40]), repr(many.stderr[-200:]), flush=True)
print(c)
