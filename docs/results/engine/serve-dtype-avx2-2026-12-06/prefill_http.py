import json, random, sys, time, urllib.request
port = int(sys.argv[1])
def req(ids, max_tokens=1):
    body = json.dumps({"model": sys.argv[2], "prompt": ids, "max_tokens": max_tokens, "temperature": 0}).encode()
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    t = time.perf_counter(); urllib.request.urlopen(r).read(); return time.perf_counter() - t
rng = random.Random(0)
req([1, 2, 3])
for L in (256, 1024, 2048):
    ts = [req([rng.randrange(100, 40000) for _ in range(L)]) for _ in range(3)]
    print(f"vllm prefill L={L}: {min(ts):.3f}s  -> {2*106e6*L/min(ts)/1e9:.1f} GFLOP/s (2*106M*L)", flush=True)
# decode: 64 tokens after a short prompt, batch 1
ts = [req([rng.randrange(100, 40000) for _ in range(16)], 64) for _ in range(2)]
print(f"vllm decode 64 tok batch1: {min(ts):.3f}s -> {min(ts)/64*1000:.1f} ms/token")
