"""Kept requests per round of a loop JSON (benchmarks/online_loop.py --out), split by whether the
same user had kept a fix for the same task in an earlier round.

    python3 docs/results/online/stale_checkouts.py docs/results/online/loop-2026-12-02.json

Before carl.online.simulate reset the user's checkout for every request, a kept fix stayed in
the checkout while the service's workspace stayed broken, so the next patch for that task
conflicted and counted as reverted: the "after an earlier kept fix" column was 0 in every round.
"""

import json
import sys

for path in sys.argv[1:]:
    outcomes = json.load(open(path))["outcomes"]
    kept: set[tuple[str, str]] = set()
    for phase in dict.fromkeys(o["phase"] for o in outcomes):
        rows = [o for o in outcomes if o["phase"] == phase]
        fresh = [o for o in rows if (o["user"], o["task"]) not in kept]
        stale = [o for o in rows if (o["user"], o["task"]) in kept]
        print(f"{path} {phase}: kept {sum(o['passed'] for o in fresh)}/{len(fresh)} never kept before, "
              f"{sum(o['passed'] for o in stale)}/{len(stale)} after an earlier kept fix")
        kept |= {(o["user"], o["task"]) for o in rows if o["passed"]}
