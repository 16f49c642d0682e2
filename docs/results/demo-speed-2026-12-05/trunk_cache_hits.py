import runpy, sys, collections
import carl.train.warm_start as ws
stats = collections.Counter()
orig_has, orig_top = ws.TrunkCache.has, ws.TrunkCache.top_logprobs
def has(self, micro):
    r = orig_has(self, micro); stats[f"has={r} rows={len(micro)}"] += 1; return r
def top(self, micro, ids, attn, mask, prefix_len=0):
    stats[f"top P={prefix_len} share_ok={self.share_ok}"] += 1; return orig_top(self, micro, ids, attn, mask, prefix_len)
ws.TrunkCache.has, ws.TrunkCache.top_logprobs = has, top
import carl.train.trainer
sys.argv = ["sft.py", "2"] + sys.argv[1:]
try:
    runpy.run_path("warm_start_epochs.py", run_name="__main__")
finally:
    print(stats)
